package torture

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/store/prune"
	"github.com/outboxchat/outboxchat/lab/env"
	"github.com/outboxchat/outboxchat/lab/fault"
	"github.com/outboxchat/outboxchat/lab/process"
)

// apply runs fault f: it waits until start+f.At, applies it (env.Inject,
// or crashPoint), waits f.For (or until ctx ends: the fault phase is over)
// and heals it. Faults on one subject (a process, Postgres, Redis, a link)
// run one at a time.
func (t *run) apply(ctx context.Context, start time.Time, f fault.Fault) {
	if env.SleepUntil(ctx, start.Add(f.At)) != nil {
		return
	}
	m := t.lock(f.Subject())
	m.Lock()
	defer m.Unlock()
	if ctx.Err() != nil {
		if cluster[f.Kind] {
			// A slow failover can hold its subject to the end of the
			// fault phase; say so, so that a reader (and the test) can
			// tell a skipped fault from a lost one.
			t.log.Add("fault", "%s: skipped, the fault phase ended while %s was busy", f.Label(), f.Subject())
		}
		return
	}
	// Healing uses a context of its own: it must run after ctx ends.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	hold := func() { _ = env.SleepUntil(ctx, time.Now().Add(f.For)) }
	if f.Kind == fault.CrashPoint {
		t.crashPoint(ctx, rctx, t.e.Proc(f.Target), f)
		return
	}
	if f.Kind == fault.PruneHistory {
		t.pruneHistory(ctx, f)
		return
	}
	switch f.Kind {
	case fault.Kill, fault.Term, fault.Stop:
		t.log.Add("fault", "%s %s", map[fault.Kind]string{fault.Kill: "SIGKILL", fault.Term: "SIGTERM", fault.Stop: "SIGSTOP"}[f.Kind], f.Target)
	}
	if cluster[f.Kind] {
		t.log.Add("fault", "%s", f.Label())
	}
	heal, err := t.e.Inject(rctx, f)
	if err != nil && (f.Kind == fault.Net || cluster[f.Kind]) {
		t.log.Add("lab", "%v", err)
		if f.Kind == fault.Net {
			return
		}
	}
	switch f.Kind {
	case fault.ClusterReshard:
		if err == nil {
			t.log.Add("fault", "%s: slot moved", f.Label())
		}
		return
	case fault.ClusterFailover:
		if err == nil {
			t.log.Add("fault", "%s: replica promoted", f.Label())
		}
	case fault.Net:
		t.log.Add("fault", "net %s", f.Label())
	case fault.RedisKill, fault.RedisStop, fault.PostgresImmediate, fault.PostgresFast, fault.NATSKill, fault.NATSStop:
		t.log.Add("fault", "%s", f.Kind)
	}
	hold()
	switch f.Kind {
	case fault.Kill, fault.Term:
		t.restart(rctx, t.e.Proc(f.Target), heal)
	case fault.Stop:
		_ = heal(rctx)
		t.log.Add("fault", "SIGCONT %s", f.Target)
	case fault.Net:
		_ = heal(rctx)
		t.log.Add("fault", "net %s removed", f.Label())
	default:
		if err := heal(rctx); err != nil {
			t.log.Add("lab", "%s restart: %v", f.Server(), err)
		}
		t.log.Add("fault", "%s up", f.Server())
	}
}

// cluster are the Redis Cluster fault kinds.
var cluster = map[fault.Kind]bool{fault.ClusterFailover: true, fault.ClusterReshard: true, fault.ClusterPause: true}

// restart starts p again (start) if it is not running.
func (t *run) restart(ctx context.Context, p *process.Proc, start env.Heal) {
	if p.Running() {
		return
	}
	if err := start(ctx); err != nil {
		t.log.Add("lab", "restart %s: %v", p.Name(), err)
		return
	}
	t.log.Add("fault", "%s started again", p.Name())
}

// crashPoint restarts p with --fault KIND:SEQ, SEQ a little above the
// highest seq the step will see next, waits until p crashes there (or the
// fault's time is up) and starts it again without the fault.
func (t *run) crashPoint(ctx, rctx context.Context, p *process.Proc, f fault.Fault) {
	side := p.Name()[:strings.IndexAny(p.Name()+"-", "-")]
	if f.Crash != fault.RelayAfterPublish {
		side = chat.Peer(side) // a worker sees the other side's seqs
	}
	var top int64
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_ = t.e.Admin().QueryRow(qctx, `SELECT coalesce(max(seq), 0) FROM `+side+`.messages`).Scan(&top)
	cancel()
	spec := fault.Spec(f.Crash, top+3)
	args := env.WithoutFlag(p.Args(), "--fault")
	_ = p.Stop(rctx)
	p.SetArgs(append(slices.Clone(args), "--fault", spec))
	t.log.Add("fault", "%s restarted with --fault %s", p.Name(), spec)
	if err := p.StartReady(rctx); err == nil {
		exited, _ := p.Exited()
		select {
		case <-exited:
			t.log.Add("fault", "%s crashed at %s", p.Name(), spec)
		case <-ctx.Done():
		case <-time.After(f.For):
		}
	}
	_ = p.Stop(rctx)
	p.SetArgs(args)
	t.restart(rctx, p, func(ctx context.Context) error { return p.StartReady(ctx) })
}

// heal ends every fault: toxics removed, servers and processes running and
// continued.
func (t *run) heal(ctx context.Context) error {
	if err := t.e.HealAll(ctx); err != nil {
		return fmt.Errorf("lab: torture: %w", err)
	}
	return nil
}

// pruneHistory deletes f.Target's history older than fault.PruneOlderThan
// (prune.Run, what retention and `outboxchat prune` run) every
// pruneEvery until f.For has passed, under load and the other faults.
// Before each prune the checker keeps what it is about to delete
// (t.keep): the rows are gone from the tables, not from what was
// delivered.
func (t *run) pruneHistory(ctx context.Context, f fault.Fault) {
	t.log.Add("fault", "prune %s history older than %v, every %v for %v", f.Target, fault.PruneOlderThan, pruneEvery, f.For)
	end := time.Now().Add(f.For)
	var total int64
	for ctx.Err() == nil && time.Now().Before(end) {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		n, err := t.keepAndPrune(pctx, prune.Config{Service: f.Target, OlderThan: fault.PruneOlderThan})
		if err != nil {
			// Postgres down, or a concurrent change to a row the prune
			// would delete (its snapshot): the next round prunes.
			t.log.Add("lab", "prune %s: %v", f.Target, err)
		}
		total += n
		cancel()
		_ = env.SleepUntil(ctx, time.Now().Add(pruneEvery))
	}
	t.log.Add("fault", "prune %s done: %d row(s) deleted", f.Target, total)
}

// pruneEvery is how often a PruneHistory fault prunes.
const pruneEvery = 300 * time.Millisecond
