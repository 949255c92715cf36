package scenario

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/internal/natsproc"
	"github.com/outboxchat/outboxchat/lab/env"
)

// natsElection bounds the wait for a stream's new leader, or for the
// cluster's meta leader after a restart.
const natsElection = 30 * time.Second

// stream returns the JetStream stream of s.queue(from) and its leader's
// node.
func (s *run) stream(ctx context.Context, from string) (jetstream.Stream, *natsproc.Server, error) {
	nc, err := s.e.NATSConn()
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, nil, err
	}
	name := chat.NATSName(env.RedisPrefix) + chat.NATSName(s.queue(from))
	st, err := js.Stream(ctx, name)
	if err != nil {
		return nil, nil, fmt.Errorf("lab: stream %s: %w", name, err)
	}
	info := st.CachedInfo()
	if info.Cluster == nil || s.e.NATSCluster.Server(info.Cluster.Leader) == nil {
		return nil, nil, fmt.Errorf("lab: stream %s has no leader among the nodes", name)
	}
	return st, s.e.NATSCluster.Server(info.Cluster.Leader), nil
}

// natsLeaderKill: a three-node JetStream cluster, streams of three
// replicas; a sender sends every 50 ms, and mid-way the node leading the
// consumers→workers stream is killed (SIGKILL): the other two elect a new
// leader, the relay's publishes fail until then and go on after, and the
// node started again catches up. Each message shown once, in order.
func natsLeaderKill(ctx context.Context, s *run) error {
	if err := s.sendEvery(ctx, 3, 100*time.Millisecond); err != nil {
		return err
	}
	st, leader, err := s.stream(ctx, chat.Consumers)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	var sendErr error
	wg.Go(func() { sendErr = s.sendEvery(ctx, 40, 50*time.Millisecond) })
	if err := env.SleepUntil(ctx, time.Now().Add(500*time.Millisecond)); err != nil {
		wg.Wait()
		return err
	}
	if err := leader.Kill(); err != nil {
		wg.Wait()
		return fmt.Errorf("lab: kill the stream leader: %w", err)
	}
	killed := time.Now()
	s.log.Add("nats", "stream leader %s (of %d replicas) killed (SIGKILL) mid-load", leader.Name(), st.CachedInfo().Config.Replicas)
	wctx, cancel := context.WithTimeout(ctx, natsElection)
	defer cancel()
	var last string
	err = env.WaitFor(wctx, 20*time.Millisecond, func() bool {
		ictx, cancel := context.WithTimeout(wctx, time.Second) // one asked of the killed node waits in vain
		info, err := st.Info(ictx)
		cancel()
		if err != nil {
			last = err.Error()
			return false
		}
		if info.Cluster != nil {
			last = fmt.Sprintf("leader %q, replicas %d", info.Cluster.Leader, len(info.Cluster.Replicas))
		}
		return info.Cluster != nil && info.Cluster.Leader != "" && info.Cluster.Leader != leader.Name()
	})
	wg.Wait()
	if err != nil {
		return fmt.Errorf("lab: no new stream leader within 30 s (last: %s)", last)
	}
	if sendErr != nil {
		return sendErr
	}
	info := st.CachedInfo()
	s.log.Add("nats", "%s leads the stream (elected within %v of the kill)", info.Cluster.Leader, time.Since(killed).Round(time.Millisecond))
	if err := leader.Start(ctx); err != nil {
		return fmt.Errorf("lab: start %s again: %w", leader.Name(), err)
	}
	if err := s.e.NATSCluster.WaitReady(wctx); err != nil {
		return err
	}
	s.log.Add("nats", "%s started again, back in the cluster", leader.Name())
	return s.sendEvery(ctx, 3, 100*time.Millisecond)
}

// natsClusterRestart: a three-node JetStream cluster; every node killed
// (SIGKILL) with messages queued for the workers, more sent while the
// cluster is down (they wait in the outbox), then every node started
// again: the streams come back from the nodes' stores, and each message is
// shown once, in order.
func natsClusterRestart(ctx context.Context, s *run) error {
	if err := s.sendEvery(ctx, 3, 100*time.Millisecond); err != nil {
		return err
	}
	startWorkers, err := s.stopWorkers(ctx)
	if err != nil {
		return err
	}
	if err := s.sendEvery(ctx, 5, 50*time.Millisecond); err != nil {
		return err
	}
	if err := s.waitAllSent(ctx); err != nil {
		return err
	}
	for _, n := range s.e.NATSCluster.Servers {
		if err := n.Kill(); err != nil {
			return fmt.Errorf("lab: kill %s: %w", n.Name(), err)
		}
	}
	s.log.Add("nats", "all 3 nodes killed (SIGKILL), 5 messages queued in the stream for the stopped workers")
	if err := s.sendEvery(ctx, 5, 50*time.Millisecond); err != nil {
		return err
	}
	errs := make([]error, len(s.e.NATSCluster.Servers))
	var wg sync.WaitGroup
	for i, n := range s.e.NATSCluster.Servers {
		wg.Go(func() { errs[i] = n.Start(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("lab: start the nodes again: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, natsElection)
	defer cancel()
	if err := s.e.NATSCluster.WaitReady(wctx); err != nil {
		return err
	}
	s.log.Add("nats", "all 3 nodes started again, a meta leader elected")
	if err := startWorkers(ctx); err != nil {
		return err
	}
	return s.sendEvery(ctx, 3, 100*time.Millisecond)
}
