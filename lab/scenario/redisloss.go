package scenario

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/lab/env"
	"github.com/outboxchat/outboxchat/lab/fault"
)

// Scenarios where Redis loses data the relay already handed it:
// the relay has marked the rows sent, so only the sender's re-drive — a
// message without a receipt after --redrive-after is published again —
// brings them back. Run with --redrive-after 0 they show the loss.

// stopWorkers stops workers (SIGTERM), logs it, and returns what starts
// it again (and logs that).
func (s *run) stopWorkers(ctx context.Context) (start func(context.Context) error, err error) {
	heal, err := s.inject(ctx, fault.Fault{Kind: fault.Term, Target: env.ProcWorkers}, "deploy", "workers stopped")
	return func(ctx context.Context) error { return s.heal(ctx, heal, "deploy", "workers started") }, err
}

// allSent waits up to d until every consumers' outbox row, in every
// partition, is marked sent (the relay handed everything to Redis); ctx's
// error when it did not.
func (s *run) allSent(ctx context.Context, d time.Duration) error {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return env.WaitFor(wctx, 50*time.Millisecond, func() bool {
		var n int
		return s.e.Admin().QueryRow(wctx, `SELECT count(*) FROM `+s.e.ConsumersOutbox()+` o WHERE sent_at IS NULL`).Scan(&n) == nil && n == 0
	})
}

// waitAllSent is allSent within 10 s, logged.
func (s *run) waitAllSent(ctx context.Context) error {
	if err := s.allSent(ctx, 10*time.Second); err != nil {
		return errors.New("lab: the relay did not publish every message")
	}
	s.log.Add("consumers-relay", "every message published and marked sent")
	return nil
}

// redisFlush: workers stopped; 20 messages sent and marked sent; FLUSHALL
// (stream, group and dedupe marks gone); workers started. The re-drive
// publishes the 20 again; workers shows each once, in seq order.
func redisFlush(ctx context.Context, s *run) error {
	startWorkers, err := s.stopWorkers(ctx)
	if err != nil {
		return err
	}
	if err := s.sendEvery(ctx, 20, 20*time.Millisecond); err != nil {
		return err
	}
	if err := s.waitAllSent(ctx); err != nil {
		return err
	}
	if err := s.e.RedisClient().FlushAll(ctx).Err(); err != nil {
		return fmt.Errorf("lab: flushall: %w", err)
	}
	s.log.Add("redis", "FLUSHALL: the 20 queued jobs, the group and the dedupe marks are gone")
	return startWorkers(ctx)
}

// streamEntryDeleted: workers stopped; 2 messages sent and marked sent;
// another consumer of the group ("ghost") reads the first and its entry is
// deleted (XDEL) while pending; workers started. Workers reclaims the
// ghost's entry after the lock duration, finds it deleted (XAUTOCLAIM's
// third reply element) and counts it; the re-drive publishes msg 1 again.
func streamEntryDeleted(ctx context.Context, s *run) error {
	startWorkers, err := s.stopWorkers(ctx)
	if err != nil {
		return err
	}
	if err := s.sendEvery(ctx, 2, 100*time.Millisecond); err != nil {
		return err
	}
	if err := s.waitAllSent(ctx); err != nil {
		return err
	}
	keys := s.queueKeys(chat.Consumers)
	res, err := s.e.RedisClient().XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: chat.Workers, Consumer: "ghost", Streams: []string{keys.Stream, ">"}, Count: 1, Block: -1,
	}).Result()
	if err != nil || len(res) == 0 || len(res[0].Messages) != 1 {
		return fmt.Errorf("lab: read one entry as the ghost consumer: %v", err)
	}
	e := res[0].Messages[0]
	s.log.Add("redis", "ghost consumer read %s (message %s) from %s", e.ID, e.Values["id"], keys.Stream)
	if err := s.e.RedisClient().XDel(ctx, keys.Stream, e.ID).Err(); err != nil {
		return fmt.Errorf("lab: xdel: %w", err)
	}
	s.log.Add("redis", "XDEL %s while pending on the ghost", e.ID)
	return startWorkers(ctx)
}

// redisFailover: a Sentinel-managed primary with one replica. Two messages
// are delivered; workers is stopped and the replica held back (SIGSTOP)
// while 5 more are published and marked sent (on the primary only:
// replication is asynchronous); the primary is killed (SIGKILL), the
// replica resumed, and the sentinels promote it, which never had the 5.
// Workers comes back on the new primary; the re-drive publishes the 5
// again, each shown once, in order.
func redisFailover(ctx context.Context, s *run) error {
	if err := s.sendEvery(ctx, 2, 200*time.Millisecond); err != nil {
		return err
	}
	startWorkers, err := s.stopWorkers(ctx)
	if err != nil {
		return err
	}
	replica := s.e.RedisReplica
	if err := replica.Pause(); err != nil {
		return err
	}
	defer func() { _ = replica.Resume() }()
	// Cut the replication link too: what the primary had written to the
	// socket would otherwise still reach the replica when it resumes.
	pc := redis.NewClient(&redis.Options{Addr: s.e.Redis.Addr()})
	err = pc.ClientKillByFilter(ctx, "TYPE", "replica").Err()
	pc.Close()
	if err != nil {
		return fmt.Errorf("lab: cut the replication link: %w", err)
	}
	s.log.Add("redis", "replica held back (SIGSTOP), its replication link cut")
	if err := s.sendEvery(ctx, 5, 100*time.Millisecond); err != nil {
		return err
	}
	if err := s.waitAllSent(ctx); err != nil {
		return err
	}
	old := s.e.Redis.Addr()
	if err := s.e.Redis.Kill(); err != nil {
		return fmt.Errorf("lab: kill redis primary: %w", err)
	}
	s.log.Add("redis", "primary %s killed (SIGKILL) before the replica got the last 5 jobs", old)
	if err := replica.Resume(); err != nil {
		return err
	}
	s.log.Add("redis", "replica resumed")
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := env.WaitFor(wctx, 100*time.Millisecond, func() bool {
		a, err := s.e.SentinelPrimary(wctx)
		return err == nil && a == replica.Addr()
	}); err != nil {
		return errors.New("lab: the sentinels did not promote the replica within 30 s")
	}
	s.log.Add("sentinel", "replica %s promoted to primary", replica.Addr())
	return startWorkers(ctx)
}
