package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/lab/env"
	"github.com/outboxchat/outboxchat/lab/probe"
)

// TestPartitionRelayKilled: consumers with 4 partitions and two separate
// relay processes (real `outboxchat serve --role relay`, lease TTL 1 s)
// hold 2 partitions each; one is killed with SIGKILL (nothing released)
// while messages to chats of every partition are being sent: the other
// takes all 4 leases once the killed one's expire, and every message
// reaches the workers' clients once, in seq order.
func TestPartitionRelayKilled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e, err := env.Start(ctx, env.Options{Partitions: 4, ConsumersRelays: 2, ExtraArgs: []string{"--lease-ttl", "1s"}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	owners := func() map[string]int {
		out := map[string]int{}
		if err := e.Admin().QueryRow(ctx, `SELECT coalesce(jsonb_object_agg(owner, n), '{}') FROM (
			SELECT owner, count(*) AS n FROM consumers.partition_leases
			WHERE owner IS NOT NULL AND expires_at > now() GROUP BY owner) l`).Scan(&out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	shares := func(want ...int) func() bool {
		return func() bool {
			got := owners()
			if len(got) != len(want) {
				return false
			}
			for _, n := range want {
				found := false
				for o, k := range got {
					if k == n {
						delete(got, o)
						found = true
						break
					}
				}
				if !found {
					return false
				}
			}
			return true
		}
	}
	if err := env.WaitFor(ctx, 50*time.Millisecond, shares(2, 2)); err != nil {
		t.Fatalf("the two relay processes never held 2 partitions each: %v", owners())
	}
	chats := []int64{50, 51, 52, 53}
	var ws []*probe.Watcher
	for _, c := range chats {
		w := connectWatcher(ctx, t, e.WorkersURL, c, e.Token)
		ws = append(ws, w)
	}
	snd := probe.NewSender(e.Token)
	const rounds = 6
	for r := 1; r <= rounds; r++ {
		if r == 3 {
			if err := e.ConsumersRelays[1].Kill(); err != nil {
				t.Fatal(err)
			}
		}
		for _, c := range chats {
			if _, err := snd.Send(ctx, e.ConsumersURL, c, fmt.Sprint("round ", r)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := env.WaitFor(ctx, 50*time.Millisecond, shares(4)); err != nil {
		t.Fatalf("the surviving relay never took all partitions: %v", owners())
	}
	for i, w := range ws {
		if err := env.WaitFor(ctx, 20*time.Millisecond, func() bool { return len(w.Seen(chat.Consumers)) == rounds }); err != nil {
			t.Fatalf("chat %d: %d of %d messages shown", chats[i], len(w.Seen(chat.Consumers)), rounds)
		}
		for j, f := range w.Frames() {
			if f.Duplicate || f.OutOfOrder || f.Message.Seq != int64(j+1) {
				t.Fatalf("chat %d: frame %d is %+v (duplicate, out of order or a gap)", chats[i], j, f)
			}
		}
	}
}

// The lab's Redis client has room for the torture's stream tap, which
// blocks in a read on every partition's stream of both directions, and
// for the drain check's reads of those streams beside it: at 16
// partitions no command waits for a free connection (with the default
// pool each XINFO waited for a blocked read to return, and the drain check
// ran out of its bound).
func TestLabClientHasRoomForTheTapAt16Partitions(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e, err := env.Start(ctx, env.Options{Partitions: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	tap, err := probe.StartTap(ctx, e)
	if err != nil {
		t.Fatal(err)
	}
	defer tap.Stop()
	before := e.RedisClient().PoolStats()
	for range 3 {
		for _, svc := range []string{chat.Consumers, chat.Workers} {
			if s := probe.StreamDrained(ctx, e, svc); s != "" {
				t.Fatalf("%s's streams: %s", svc, s)
			}
		}
	}
	after := e.RedisClient().PoolStats()
	if after.WaitCount != before.WaitCount || after.Timeouts != before.Timeouts {
		t.Fatalf("commands waited for a pooled connection %d times (%d timeouts) beside the tap's %d blocking reads",
			after.WaitCount-before.WaitCount, after.Timeouts-before.Timeouts, 2*16)
	}
}
