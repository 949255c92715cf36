package redisq_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/redisq"
)

func (q *queue) presence(t *testing.T, ttl time.Duration) *redisq.Presence {
	t.Helper()
	p, err := redisq.NewPresence(q.rdb, q.prefix, "chat", "workers", ttl)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Two processes claiming the same base at once get different names; a
// name left (graceful stop) or expired (a dead process) is claimed again.
func TestPresenceClaimsUniqueNames(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t, nil)
	a, b := q.presence(t, 0), q.presence(t, 300*time.Millisecond)
	na, err := a.Claim(ctx, "workers-host")
	if err != nil {
		t.Fatal(err)
	}
	nb, err := b.Claim(ctx, "workers-host")
	if err != nil {
		t.Fatal(err)
	}
	if na != "workers-host-0" || nb != "workers-host-1" {
		t.Fatalf("claimed %q and %q, want workers-host-0 and workers-host-1", na, nb)
	}
	// a stops gracefully: a new process gets its name (and its pending list).
	if err := a.Leave(ctx, na); err != nil {
		t.Fatal(err)
	}
	c := q.presence(t, 0)
	if n, err := c.Claim(ctx, "workers-host"); err != nil || n != na {
		t.Fatalf("claim after leave = %q, %v; want %q", n, err, na)
	}
	// b dies (no refresh): its name is free once its ttl has passed.
	d := q.presence(t, 0)
	var n string
	deadline := time.Now().Add(5 * time.Second)
	for n != nb && time.Now().Before(deadline) {
		if n != "" {
			_ = d.Leave(ctx, n)
		}
		if n, err = d.Claim(ctx, "workers-host"); err != nil {
			t.Fatal(err)
		}
	}
	if n != nb {
		t.Fatalf("claim after b expired = %q, want %q", n, nb)
	}
	live, err := redisq.LiveConsumers(ctx, q.rdb, q.prefix, "chat")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range live {
		names = append(names, l.Name+"="+l.Instance)
	}
	want := []string{na + "=" + c.Instance(), nb + "=" + d.Instance()}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Fatalf("live consumers %v, want %v", names, want)
	}
}

// Two live processes given the same explicit name see each other.
func TestPresenceBeatReportsSharedName(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t, nil)
	a, b := q.presence(t, 0), q.presence(t, 0)
	if others, err := a.Beat(ctx, "w"); err != nil || others != nil {
		t.Fatalf("first beat = %v, %v; want alone", others, err)
	}
	if others, err := b.Beat(ctx, "w"); err != nil || len(others) != 1 || others[0].Instance != a.Instance() || others[0].Name != "w" {
		t.Fatalf("b's beat = %v, %v; want [%s]", others, err, a.Instance())
	}
	first, err := a.Beat(ctx, "w")
	if err != nil || len(first) != 1 || first[0].Instance != b.Instance() {
		t.Fatalf("a's beat = %v, %v; want [%s]", first, err, b.Instance())
	}
	// b refreshes: a sees its expiry move on (b is alive).
	testenv.WaitFor(t, 5*time.Second, "b's expiry to move on", func() bool {
		if _, err := b.Beat(ctx, "w"); err != nil {
			t.Fatal(err)
		}
		again, err := a.Beat(ctx, "w")
		return err == nil && len(again) == 1 && again[0].Expires.After(first[0].Expires)
	})
	// Another group's "w" is not the same consumer.
	o, err := redisq.NewPresence(q.rdb, q.prefix, "chat", "consumers", 0)
	if err != nil {
		t.Fatal(err)
	}
	if others, err := o.Beat(ctx, "w"); err != nil || others != nil {
		t.Fatalf("other group's beat = %v, %v; want alone", others, err)
	}
	if err := b.Leave(ctx, "w"); err != nil {
		t.Fatal(err)
	}
	if others, err := a.Beat(ctx, "w"); err != nil || others != nil {
		t.Fatalf("beat after b left = %v, %v; want alone", others, err)
	}
}

// PruneGone deletes a dead consumer once it has nothing pending, never a
// live one or one with pending entries.
func TestPresencePrunesGoneConsumers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t, nil)
	live := q.presence(t, 0)
	if gone, err := live.PruneGone(ctx, 0); err != nil || len(gone) != 0 {
		t.Fatalf("prune before the stream exists = %v, %v", gone, err)
	}
	if _, err := live.Beat(ctx, "live"); err != nil {
		t.Fatal(err)
	}
	q.add(t, 1, 0)
	// "dead" took an entry and died with it pending; "idle" read nothing
	// and died; "live" is alive and idle.
	fetchN(t, q.consumer(t, "dead", nil), 1)
	for _, n := range []string{"idle", "live"} {
		if _, err := q.consumer(t, n, &redisq.ConsumerConfig{Block: time.Millisecond}).Fetch(ctx, 1); err != nil {
			t.Fatal(err)
		}
	}
	gone, err := live.PruneGone(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := q.rdb.XInfoConsumers(ctx, q.keys.Stream, "workers").Result()
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, c := range cons {
		left = append(left, c.Name)
	}
	slices.Sort(left)
	if !slices.Contains(gone, "idle") || slices.Contains(gone, "dead") || slices.Contains(gone, "live") ||
		!slices.Equal(left, []string{"dead", "live"}) {
		t.Fatalf("pruned %v, left %v; want idle pruned, dead (pending) and live kept", gone, left)
	}
	// An idle threshold not yet reached keeps everyone.
	if gone, err := live.PruneGone(ctx, time.Hour); err != nil || len(gone) != 0 {
		t.Fatalf("prune with 1h idle = %v, %v", gone, err)
	}
}
