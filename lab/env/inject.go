package env

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"github.com/outboxchat/outboxchat/lab/fault"
	"github.com/outboxchat/outboxchat/lab/process"
)

// Heal reverts one injected fault (Env.Inject). It is never nil.
type Heal func(ctx context.Context) error

// Proc returns the service process named name (Procs), nil if none.
func (e *Env) Proc(name string) *process.Proc {
	for _, p := range e.Procs() {
		if p.Name() == name {
			return p
		}
	}
	return nil
}

// Inject applies f to the environment at once (f.At and f.For are the
// caller's to honour) and returns what heals it:
//
//	fault.Kill, fault.Term  SIGKILL / SIGTERM process f.Target; heal starts it again (if it is not running)
//	fault.Stop              SIGSTOP process f.Target; heal continues it
//	fault.RedisKill         SIGKILL Redis; fault.RedisStop: graceful shutdown; heal starts it again
//	fault.NATSKill          SIGKILL the nats-server (Options.Broker BrokerNATS, no cluster); fault.NATSStop: SIGTERM; heal starts it again
//	fault.PostgresImmediate, fault.PostgresFast  stop Postgres in that mode; heal starts it again
//	fault.Net               a toxic on link f.Target (needs Options.Links); heal removes it
//	fault.ClusterFailover   kill the master of f.Target's queue once its replica is in sync (writes paused meanwhile), and wait for the promotion; heal: the old master rejoins as a replica
//	fault.ClusterReshard    move the slot of f.Target's queue to another master key by key (done when Inject returns); heal: nothing
//	fault.ClusterPause      SIGSTOP the master of f.Target's queue; heal continues it
//
// fault.CrashPoint is not injected here: it restarts a process with
// --fault (fault.Spec), which needs the seq to crash at. The error is
// Inject's own (an unknown target, a signal that failed); the heal it
// returns is valid even then and heals what was done.
func (e *Env) Inject(ctx context.Context, f fault.Fault) (Heal, error) {
	none := func(context.Context) error { return nil }
	switch f.Kind {
	case fault.Kill, fault.Term, fault.Stop:
		p := e.Proc(f.Target)
		if p == nil {
			return none, fmt.Errorf("lab: inject %s: no process %q", f.Kind, f.Target)
		}
		if f.Kind == fault.Stop {
			return func(context.Context) error { return p.Signal(syscall.SIGCONT) }, p.Signal(syscall.SIGSTOP)
		}
		start := func(ctx context.Context) error {
			if p.Running() {
				return nil
			}
			return p.StartReady(ctx)
		}
		if f.Kind == fault.Kill {
			return start, p.Kill()
		}
		return start, p.Stop(ctx)
	case fault.RedisKill, fault.RedisStop:
		return takeDown(ctx, "redis", e.Redis, f.Kind == fault.RedisKill)
	case fault.NATSKill, fault.NATSStop:
		if e.NATS == nil {
			return none, fmt.Errorf("lab: inject %s: no single nats-server in this lab (--broker nats without --nats-cluster)", f.Kind)
		}
		return takeDown(ctx, "nats-server", e.NATS, f.Kind == fault.NATSKill)
	case fault.PostgresImmediate, fault.PostgresFast:
		heal := func(ctx context.Context) error {
			if err := e.Postgres.Restart(ctx); err != nil {
				return fmt.Errorf("lab: restart postgres: %w", err)
			}
			return nil
		}
		stop := e.Postgres.Stop
		if f.Kind == fault.PostgresImmediate {
			stop = e.Postgres.StopImmediate
		}
		if err := stop(ctx); err != nil {
			return heal, fmt.Errorf("lab: stop postgres: %w", err)
		}
		return heal, nil
	case fault.ClusterFailover, fault.ClusterReshard, fault.ClusterPause:
		return e.injectCluster(ctx, f)
	case fault.Net:
		if e.links == nil {
			return none, errors.New("lab: inject net: the environment has no Links")
		}
		name, err := e.links.Add(f.Target, f.Net, f.Stream, f.Attrs)
		if err != nil {
			return none, err
		}
		return func(context.Context) error { e.links.Remove(f.Target, name); return nil }, nil
	}
	return none, fmt.Errorf("lab: inject: %q is not injected by Inject", f.Kind)
}

// server is a private server a fault takes down: redisproc's, natsproc's.
// Restart starts it again whether it was killed or stopped.
type server interface {
	Kill() error
	Stop(ctx context.Context) error
	Restart(ctx context.Context) error
}

// takeDown SIGKILLs s (kill) or shuts it down gracefully, and returns the
// heal that starts it again; name goes in the errors.
func takeDown(ctx context.Context, name string, s server, kill bool) (Heal, error) {
	heal := func(ctx context.Context) error {
		if err := s.Restart(ctx); err != nil {
			return fmt.Errorf("lab: restart %s: %w", name, err)
		}
		return nil
	}
	if kill {
		if err := s.Kill(); err != nil {
			return heal, fmt.Errorf("lab: kill %s: %w", name, err)
		}
	} else if err := s.Stop(ctx); err != nil {
		return heal, fmt.Errorf("lab: stop %s: %w", name, err)
	}
	return heal, nil
}

// HealAll ends every fault: toxics removed (with Options.Links), Postgres,
// Redis (every node of a cluster) and the nats-servers running and continued, every service
// process running and continued. It
// returns the first failure to start something.
func (e *Env) HealAll(ctx context.Context) error {
	if e.links != nil {
		e.links.Clear()
	}
	if !e.Postgres.Running() {
		if err := e.Postgres.Restart(ctx); err != nil {
			return fmt.Errorf("heal postgres: %w", err)
		}
	}
	if !e.Redis.Running() {
		if err := e.Redis.Restart(ctx); err != nil {
			return fmt.Errorf("heal redis: %w", err)
		}
	}
	for _, s := range e.natsServers() {
		if !s.Running() {
			if err := s.Start(ctx); err != nil {
				return fmt.Errorf("heal nats-server %s: %w", s.Name(), err)
			}
		}
	}
	if c := e.RedisCluster; c != nil {
		for _, s := range c.Nodes {
			if s.Running() {
				_ = s.Resume()
				continue
			}
			if err := s.Restart(ctx); err != nil {
				return fmt.Errorf("heal redis cluster node %s: %w", s.Addr(), err)
			}
		}
	}
	for _, p := range e.Procs() {
		if p.Running() {
			_ = p.Signal(syscall.SIGCONT)
			continue
		}
		if err := p.StartReady(ctx); err != nil {
			return fmt.Errorf("heal: %w", err)
		}
	}
	return nil
}
