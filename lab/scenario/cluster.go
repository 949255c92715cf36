package scenario

import (
	"context"
	"errors"
	"sort"
	"sync"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/internal/redisproc"
	"github.com/outboxchat/outboxchat/lab/env"
	"github.com/outboxchat/outboxchat/lab/probe"
)

// Scenarios on the lab's Redis Cluster (env.Options.RedisCluster: 3
// masters, 3 replicas).

// clusterFailover: the master that holds the consumers' queue is killed
// while its replica, held back (frozen, its replication link cut), lacks
// the last jobs the relay handed the master and marked sent; the cluster
// promotes the replica. Workers is stopped meanwhile, so those jobs
// waited in the old master's stream only. Messages are sent before, while
// the replica is held back, during the kill and promotion, and after; the
// re-drive brings what the promoted replica never had, each shown once,
// in order.
func clusterFailover(ctx context.Context, s *run) error {
	c := s.e.RedisCluster
	if err := s.sendEvery(ctx, 2, 200*time.Millisecond); err != nil {
		return err
	}
	startWorkers, err := s.stopWorkers(ctx)
	if err != nil {
		return err
	}
	stream := s.queueKeys(chat.Consumers).Stream
	master, slot, err := c.NodeFor(ctx, stream)
	if err != nil {
		return err
	}
	f, err := c.StartFailover(ctx, master)
	if err != nil {
		return err
	}
	defer func() { _ = f.Release() }()
	if err := c.WaitSynced(ctx); err != nil {
		return err
	}
	if err := f.HoldBack(ctx); err != nil {
		return err
	}
	s.log.Add("redis", "replica %s of master %s (slot %d, the queue's) held back (SIGSTOP), its replication link cut", f.Replica.Addr(), master.Addr(), slot)
	if err := s.sendEvery(ctx, 5, 100*time.Millisecond); err != nil {
		return err
	}
	if err := s.waitAllSent(ctx); err != nil {
		return err
	}
	s.log.Add("redis", "master %s killed (SIGKILL) before its replica got the last 5 jobs; replica resumed", master.Addr())
	killed := make(chan error, 1)
	killedAt := time.Now()
	go func() { killed <- f.KillMaster(ctx) }()
	// Sent across the failover: saved while the slot has no master
	// (CLUSTERDOWN), published once the replica is promoted.
	if err := s.sendEvery(ctx, 3, 300*time.Millisecond); err != nil {
		return err
	}
	if err := <-killed; err != nil {
		return err
	}
	s.log.Add("redis", "replica %s promoted to master of slot %d, %.1fs after the kill", f.Replica.Addr(), slot, time.Since(killedAt).Seconds())
	if err := startWorkers(ctx); err != nil {
		return err
	}
	return s.sendEvery(ctx, 3, 200*time.Millisecond)
}

// clusterReshard: the slots of both directions' queues move to another
// master under load: a sender sends every 50 ms throughout while each
// slot's keys are migrated one by one (MIGRATE, 50 ms apart) and the slot
// handed over, as redis-cli --cluster reshard does it live. The relay's
// and the worker's scripts meet ASK and TRYAGAIN and retry. It measures
// the longest gap between consecutive messages shown during the move
// (from its start to 1 s after its end) against the same before it.
func clusterReshard(ctx context.Context, s *run) error {
	c := s.e.RedisCluster
	const interval = 50 * time.Millisecond
	sctx, stopSending := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for sctx.Err() == nil {
			if err := env.SleepUntil(sctx, s.lastSend.Add(interval)); err != nil {
				return
			}
			s.send(sctx)
		}
	}()
	stop := func() {
		stopSending()
		wg.Wait()
	}
	defer stop()
	if err := env.SleepUntil(ctx, time.Now().Add(2*time.Second)); err != nil {
		return err
	}
	moveStart := time.Now()
	moved := map[int]bool{}
	for _, svc := range []string{chat.Consumers, chat.Workers} {
		stream := s.queueKeys(svc).Stream
		from, slot, err := c.NodeFor(ctx, stream)
		if err != nil {
			return err
		}
		if moved[slot] {
			continue
		}
		moved[slot] = true
		to, err := otherMaster(ctx, c, from)
		if err != nil {
			return err
		}
		if err := s.moveSlot(ctx, c, slot, to, interval); err != nil {
			return err
		}
		s.log.Add("redis", "slot %d (queue %s) moved from %s to %s, key by key, under load", slot, s.queue(svc), from.Addr(), to.Addr())
	}
	moveEnd := time.Now()
	if err := env.SleepUntil(ctx, moveEnd.Add(time.Second)); err != nil {
		return err
	}
	stop()
	// Measure once everything sent is shown (WaitSettled waits again,
	// harmlessly).
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	_ = env.WaitFor(wctx, 100*time.Millisecond, func() bool { return probe.Settled(wctx, s.e, s.w) })
	cancel()
	frames := s.w.Frames()
	before := maxGap(frames, moveStart.Add(-2*time.Second), moveStart)
	during := maxGap(frames, moveStart, moveEnd.Add(time.Second))
	s.measures.MaxGapBeforeMs, s.measures.MaxGapDuringMs = before.Milliseconds(), during.Milliseconds()
	s.measures.MoveMs = moveEnd.Sub(moveStart).Milliseconds()
	s.log.Add("lab", "longest gap between messages shown: %d ms during the move (%d ms long), %d ms in the 2 s before (one sent every %d ms)",
		during.Milliseconds(), s.measures.MoveMs, before.Milliseconds(), interval.Milliseconds())
	return nil
}

// moveSlot moves slot to the master to, key by key, pause apart
// (env.MoveSlotKeyByKey), and logs how many keys moved so.
func (s *run) moveSlot(ctx context.Context, c *redisproc.Cluster, slot int, to *redisproc.Server, pause time.Duration) error {
	n, err := env.MoveSlotKeyByKey(ctx, c, slot, to, pause)
	if err != nil {
		return err
	}
	s.log.Add("redis", "slot %d: %d keys migrated one by one", slot, n)
	return nil
}

// otherMaster returns a master of c other than from.
func otherMaster(ctx context.Context, c *redisproc.Cluster, from *redisproc.Server) (*redisproc.Server, error) {
	ms, err := c.Masters(ctx)
	if err != nil {
		return nil, err
	}
	for _, m := range ms {
		if m != from {
			return m, nil
		}
	}
	return nil, errors.New("lab: no other master to move the slot to")
}

// maxGap returns the longest time between consecutive frames (in arrival
// order) whose later frame arrived in [from, to], 0 with fewer than two.
func maxGap(frames []probe.Shown, from, to time.Time) time.Duration {
	sort.Slice(frames, func(i, j int) bool { return frames[i].At.Before(frames[j].At) })
	var best time.Duration
	for i := 1; i < len(frames); i++ {
		at := frames[i].At
		if at.Before(from) || at.After(to) {
			continue
		}
		best = max(best, at.Sub(frames[i-1].At))
	}
	return best
}
