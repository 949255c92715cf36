package redisq_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/internal/redisproc"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/redisq"
)

// ackPublisher is a publisher of queue "chat" through rdb that waits for
// one replica's acknowledgement of every add, 300 ms at most.
func ackPublisher(t *testing.T, rdb redis.UniversalClient, prefix string) *redisq.Publisher {
	t.Helper()
	p, err := redisq.NewPublisher(rdb, &redisq.PublisherConfig{Queue: "chat", Prefix: prefix,
		ReplicaAcks: 1, ReplicaAckTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// With ReplicaAcks an add succeeds only once a replica has it: a frozen
// replica fails it, and so does the retry of the same job (a duplicate
// writes nothing of its own, but its success would vouch for the first
// add), even from another connection; once the replica is back the retry
// succeeds and the replica has the entry when Add returns.
func TestReplicaAcksWaitForTheReplica(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	master, rdb := privateRedis(t)
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	replica, err := redisproc.Start(sctx, &redisproc.Options{ReplicaOf: master.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = replica.Close() })
	rc := nodeClient(t, replica)
	testenv.WaitFor(t, 20*time.Second, "replica in sync", func() bool {
		info, _ := rc.Info(ctx, "replication").Result()
		return containsLine(info, "master_link_status:up")
	})
	prefix := testenv.Prefix(t)
	pub := ackPublisher(t, rdb, prefix)
	testenv.WaitFor(t, 20*time.Second, "the master counts its replica in sync", func() bool {
		counts, err := redisq.ReplicasInSync(ctx, rdb)
		return err == nil && counts["redis"] == 1 && len(counts) == 1
	})
	if n, err := pub.Add(ctx, jobs(3, 0)...); err != nil || n != 3 {
		t.Fatalf("add with the replica up: %d, %v", n, err)
	}
	// WAIT returned: the replica has applied the adds already.
	if n := rc.XLen(ctx, pub.Keys().Stream).Val(); n != 3 {
		t.Fatalf("replica's stream has %d entries right after Add, want 3", n)
	}
	// Through Sentinel (go-redis's failover client, a *redis.Client) the
	// same: the wait runs on the primary's connection.
	sentinelPub := ackPublisher(t, sentinelClient(t, master.Addr()), prefix+"sentinel:")
	if n, err := sentinelPub.Add(ctx, jobs(2, 0)...); err != nil || n != 2 {
		t.Fatalf("add through Sentinel with the replica up: %d, %v", n, err)
	}
	if n := rc.XLen(ctx, sentinelPub.Keys().Stream).Val(); n != 2 {
		t.Fatalf("replica's stream (through Sentinel) has %d entries right after Add, want 2", n)
	}

	if err := replica.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = replica.Resume()
		}
	}()
	if n, err := pub.Add(ctx, jobs(1, 3)...); !errors.Is(err, redisq.ErrNotReplicated) {
		t.Fatalf("add with the replica frozen: %d, %v; want ErrNotReplicated", n, err)
	}
	// The same job again, from a client whose connection never wrote: it
	// is a duplicate on the master, and still not on the replica.
	other, err := redisq.NewClient(master.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if n, err := ackPublisher(t, other, prefix).Add(ctx, jobs(1, 3)...); !errors.Is(err, redisq.ErrNotReplicated) {
		t.Fatalf("retry of the unreplicated job from a fresh connection: %d, %v; want ErrNotReplicated", n, err)
	}
	// Without ReplicaAcks the master alone answers: success.
	plain := newClusterPublisher(t, rdb, prefix)
	if n, err := plain.Add(ctx, jobs(1, 4)...); err != nil || n != 1 {
		t.Fatalf("add without ReplicaAcks, replica frozen: %d, %v", n, err)
	}

	resumed = true
	if err := replica.Resume(); err != nil {
		t.Fatal(err)
	}
	// A replica just continued may need a moment to answer.
	if n := addReplicated(t, pub, jobs(1, 3)); n != 0 {
		t.Fatalf("retry with the replica back added %d; want 0 (a duplicate)", n)
	}
	if got := streamJobs(t, rc, pub.Keys().Stream); len(got) != 5 || got["job-3"] != 1 {
		t.Fatalf("replica's stream after the retry: %v; want job-0..job-4 once each", got)
	}
}

// Without a replica an add with ReplicaAcks fails once its wait is over;
// a client the wait cannot follow (a Ring) or a wait longer than half the
// client's read timeout is refused at NewPublisher.
func TestReplicaAcksWithoutReplicaOrOnAWrongClient(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	if counts, err := redisq.ReplicasInSync(ctx, rdb); err != nil || len(counts) != 1 || counts["redis"] != 0 {
		t.Fatalf("replicas in sync of a server without any: %v, %v", counts, err)
	}
	pub := ackPublisher(t, rdb, testenv.Prefix(t))
	start := time.Now()
	if _, err := pub.Add(ctx, jobs(1, 0)...); !errors.Is(err, redisq.ErrNotReplicated) {
		t.Fatalf("add without a replica: %v; want ErrNotReplicated", err)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("add failed after %v, before its 300ms wait was over", d)
	}
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	defer ring.Close()
	for _, c := range []struct {
		rdb redis.UniversalClient
		cfg redisq.PublisherConfig
	}{
		{ring, redisq.PublisherConfig{Queue: "chat", ReplicaAcks: 1}},
		{rdb, redisq.PublisherConfig{Queue: "chat", ReplicaAcks: 1, ReplicaAckTimeout: rdb.Options().ReadTimeout/2 + time.Millisecond}},
		{rdb, redisq.PublisherConfig{Queue: "chat", ReplicaAcks: -1}},
	} {
		if _, err := redisq.NewPublisher(c.rdb, &c.cfg); !errors.Is(err, redisq.ErrInvalidConfig) {
			t.Errorf("NewPublisher(%T, acks %d, timeout %v): %v; want ErrInvalidConfig", c.rdb, c.cfg.ReplicaAcks, c.cfg.ReplicaAckTimeout, err)
		}
	}
}

// addReplicated adds js through pub, again while the call fails with
// ErrNotReplicated (a replica not counted yet), for at most 10 s, and
// returns how many the successful call added. Any other error fails t.
func addReplicated(t *testing.T, pub *redisq.Publisher, js []redisq.Job) int {
	t.Helper()
	var n int
	testenv.WaitFor(t, 10*time.Second, "an add acknowledged by the replicas", func() bool {
		var err error
		n, err = pub.Add(context.Background(), js...)
		if err != nil && !errors.Is(err, redisq.ErrNotReplicated) {
			t.Fatalf("add waiting for replicas: %v", err)
		}
		return err == nil
	})
	return n
}

// containsLine reports whether INFO text info has the line line.
func containsLine(info, line string) bool {
	for _, l := range strings.Split(info, "\n") {
		if strings.TrimSpace(l) == line {
			return true
		}
	}
	return false
}
