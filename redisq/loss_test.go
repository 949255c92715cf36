package redisq_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/redisq"
)

type lossCounts struct {
	counts
	mu      sync.Mutex
	deleted int
}

func (c *lossCounts) JobsDeleted(_ string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deleted += n
}

// A pending entry of another consumer (read, never acked) is deleted with
// XDEL: XAUTOCLAIM reports it in its third reply element; the live
// consumer acks it away, counts it and delivers the rest.
func TestReclaimCountsDeletedEntries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t, nil)
	m := &lossCounts{}
	cfg := &redisq.ConsumerConfig{LockDuration: 100 * time.Millisecond, Metrics: m}
	ghost := q.consumer(t, "ghost", cfg)
	live := q.consumer(t, "live", cfg)
	if _, err := q.pub.Add(ctx, jobs(2, 0)...); err != nil {
		t.Fatal(err)
	}
	taken := fetchN(t, ghost, 2)
	if err := q.rdb.XDel(ctx, q.keys.Stream, taken[0].StreamID).Err(); err != nil {
		t.Fatal(err)
	}
	var got []redisq.Delivery
	testenv.WaitFor(t, 10*time.Second, "the live entry reclaimed", func() bool {
		ds, err := live.Fetch(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ds...)
		return len(got) > 0
	})
	if len(got) != 1 || got[0].ID != "job-1" {
		t.Fatalf("reclaimed %v, want job-1 only", ids(got))
	}
	if live.DeletedPending() != 1 {
		t.Fatalf("DeletedPending = %d, want 1", live.DeletedPending())
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.deleted != 1 {
		t.Fatalf("JobsDeleted counted %d, want 1", m.deleted)
	}
}

// The group vanishes between a fetch and its ack (FLUSHALL) while jobs are
// added to a new stream: the next fetch meets NOGROUP and creates the group
// again from 0 (not $), so the jobs added before it are delivered.
func TestAckNoGroupRecreatesGroupFromZero(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t, nil)
	c := q.consumer(t, "w1", nil)
	if _, err := q.pub.Add(ctx, jobs(1, 0)...); err != nil {
		t.Fatal(err)
	}
	ds := fetchN(t, c, 1)
	// The stream and group are lost; another publisher adds two jobs to a
	// fresh stream (no group yet) before the ack.
	if err := q.rdb.Del(ctx, q.keys.Stream).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := q.pub.Add(ctx, jobs(2, 1)...); err != nil {
		t.Fatal(err)
	}
	// XACK on a stream without the group answers 0 or NOGROUP depending on
	// the server; either way nothing breaks.
	_ = c.Ack(ctx, ds[0].StreamID)
	got := fetchN(t, c, 2)
	if ids(got)[0] != "job-1" || ids(got)[1] != "job-2" {
		t.Fatalf("after the group came back: %v, want job-1, job-2 (created from 0, not $)", ids(got))
	}
}

// Readd adds a job whose dedupe key is still there (its entry lost), where
// Add would see a duplicate.
func TestReaddGetsPastTheDedupeKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t, nil)
	if _, err := q.pub.Add(ctx, jobs(1, 0)...); err != nil {
		t.Fatal(err)
	}
	if err := q.rdb.Del(ctx, q.keys.Stream).Err(); err != nil { // entry lost, key kept
		t.Fatal(err)
	}
	if n, err := q.pub.Add(ctx, jobs(1, 0)...); err != nil || n != 0 {
		t.Fatalf("Add = %d, %v; want 0 (the dedupe key says duplicate)", n, err)
	}
	if n, err := q.pub.Readd(ctx, jobs(1, 0)...); err != nil || n != 1 {
		t.Fatalf("Readd = %d, %v; want 1", n, err)
	}
	if n := q.rdb.XLen(ctx, q.keys.Stream).Val(); n != 1 {
		t.Fatalf("stream length %d, want 1", n)
	}
	if ttl := q.rdb.PTTL(ctx, q.keys.Dedupe("job-0")).Val(); ttl <= 0 {
		t.Fatalf("dedupe key TTL %v, want set", ttl)
	}
	if _, err := q.pub.Readd(ctx, redisq.Job{}); err == nil {
		t.Fatal("Readd of an empty id succeeded")
	}
}
