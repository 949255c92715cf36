package probe

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/natsq"
)

// TestNATSTap: the tap reads a JetStream stream from its start, across a
// nats-server restart, flags a new seq published below the highest of its
// chat (and not a re-drive's copy of a seq seen), and counts as
// acknowledged exactly the events at or below the durable consumer's ack
// floor.
func TestNATSTap(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a private nats-server")
	}
	t.Parallel()
	ns := testenv.PrivateNATS(t)
	ctx := context.Background()
	nc, err := natsq.Connect(ns.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	q, err := natsq.New(ctx, nc, natsq.Config{Queue: "consumers-to-workers"})
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	tap := &Tap{js: js, seen: map[string]map[int64]map[int64]bool{chat.Consumers: {}}, top: map[string]map[int64]int64{chat.Consumers: {}},
		lanes: []lane{{chat.Consumers, q.Stream()}}, entries: map[string]map[string]string{q.Stream(): {}},
		confirmed: map[string]bool{}, early: map[string]string{}}
	ev := func(id string, seq int64) natsq.Event {
		return natsq.Event{ID: id, Name: chat.EventMessageCreated, Payload: fmt.Appendf(nil, `{"id":%q,"chat_id":1,"seq":%d}`, id, seq)}
	}
	// Two events before the tap starts: it reads from the stream's start.
	if err := q.Publish(ctx, ev("m1", 1), ev("m2", 2)); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); tap.natsRead(rctx, tap.lanes[0]) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
	read := func(n int) {
		t.Helper()
		testenv.WaitFor(t, 20*time.Second, fmt.Sprintf("the tap read %d entries", n), func() bool { got, _ := tap.Counts(); return got == n })
	}
	read(2)

	// The receiver takes both and acknowledges the first: the ack floor is 1.
	c, err := q.NewConsumer(ctx, natsq.ConsumerConfig{Group: chat.NATSName(chat.Workers), FetchWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var ds []natsq.Delivery
	testenv.WaitFor(t, 10*time.Second, "both events fetched", func() bool {
		more, _ := c.Fetch(ctx, 2-len(ds))
		ds = append(ds, more...)
		return len(ds) == 2
	})
	if err := c.Ack(ctx, ds[0].Ref); err != nil {
		t.Fatal(err)
	}
	cand := map[string]string{"1": "m1", "2": "m2"}
	var acked map[string]string
	testenv.WaitFor(t, 10*time.Second, "the ack of seq 1 seen", func() bool {
		acked = tap.natsAcked(ctx, q.Stream(), chat.Workers, cand)
		return len(acked) > 0
	})
	if len(acked) != 1 || acked["1"] != "m1" {
		t.Fatalf("acknowledged: %v, want only stream seq 1 (m1)", acked)
	}

	// A restart: the tap goes on where it was, reading each event once.
	if err := ns.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, "a publish after the restart", func() bool {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		// A re-drive's copy of seq 2 (a seq seen: allowed), then seq 4.
		return q.Republish(pctx, ev("m2", 2)) == nil && q.Publish(pctx, ev("m4", 4)) == nil
	})
	read(4)
	if v := tap.Violations(); len(v) != 0 {
		t.Fatalf("in-order entries flagged: %v", v)
	}
	if err := q.Publish(ctx, ev("m3", 3)); err != nil { // below 4: out of order
		t.Fatal(err)
	}
	read(5)
	if v := tap.Violations(); len(v) != 1 || !strings.Contains(v[0], "chat 1 seq 3 added after seq 4") {
		t.Fatalf("want seq 3 after 4 flagged, got %v", v)
	}
}
