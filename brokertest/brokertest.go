// Package brokertest is the conformance suite a broker adapter passes to
// carry the outbox relay's events to the inbox: an outbox.Publisher on one
// side, an inbox.Source on the other, and the guarantees the two packages
// build on. redisq (Redis Streams) and natsq (NATS JetStream) run it
// against private servers; an adapter of your own can run it too.
//
// What it checks, each on a queue of its own:
//   - publish, consume, ack: every message once, in publish order, with its
//     id, name, payload and headers;
//   - a duplicate publish (same id, a second Publish) is delivered once;
//   - a crash before the ack: a delivery not acknowledged is handed to
//     another consumer of the group after the lock duration;
//   - a poison message is dead-lettered: out of the queue, not delivered
//     again, listed with its reason;
//   - order: 200 messages published in batches arrive in order;
//   - broker restart: what was acknowledged stays acknowledged, what was
//     not is delivered (at-least-once), nothing published is lost;
//   - broker down: Publish fails within the caller's deadline (no retry
//     loop that holds the relay), and the same batch published once the
//     broker is back is delivered once.
package brokertest

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/outbox"
)

// Broker is one broker under test. Every function is required; each is
// called from the test goroutine of the test it is given.
type Broker struct {
	// NewQueue returns a fresh queue nothing else uses.
	NewQueue func(t *testing.T) Queue
	// Stop stops the broker gracefully (SIGTERM), keeping its data; Start
	// starts it again on the same address. The suite calls them only in its
	// sequential tests, after the others finished.
	Stop, Start func(t *testing.T)
}

// Queue is one queue of the Broker.
type Queue struct {
	// Publisher publishes into the queue (the relay's side).
	Publisher outbox.Publisher
	// Source opens a consumer named consumer in group, with lock duration
	// (or ack wait) LockDuration (the inbox's side). Its Fetch may wait up
	// to a second for new deliveries.
	Source func(t *testing.T, group, consumer string) inbox.Source
	// LockDuration is the Sources' lock duration: how long a delivery may
	// go unacknowledged before it is handed out again. Keep it short (the
	// suite waits for it); 1 s is typical.
	LockDuration time.Duration
	// DeadLetters returns the ids and reasons of the queue's dead letters,
	// oldest first.
	DeadLetters func(t *testing.T) []DeadLetter
}

// DeadLetter is a dead-lettered message as the suite checks it.
type DeadLetter struct{ ID, Reason string }

// Server is a broker's server that stops and starts again in place, on
// its address and with its data (redisproc.Server and natsproc.Server
// are).
type Server interface {
	Stop(ctx context.Context) error
	Start(ctx context.Context) error
}

// StopStart returns a Broker's Stop and Start for srv: Stop stops it
// gracefully; Start starts it again and then, when ready is not nil, polls
// ready every 10 ms until it reports true (a client that reconnects on its
// own is back), all within 30 s. Either fails t on error.
func StopStart(srv Server, ready func() bool) (stop, start func(t *testing.T)) {
	stop = func(t *testing.T) {
		if err := srv.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	start = func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := srv.Start(ctx); err != nil {
			t.Fatal(err)
		}
		for ready != nil && !ready() {
			select {
			case <-ctx.Done():
				t.Fatalf("broker restarted but not ready: %v", ctx.Err())
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	return stop, start
}

// DeadLettersOf returns a Queue's DeadLetters for a broker whose list
// returns the queue's dead letters oldest first (the suite needs at most
// 100), each made a DeadLetter by fields. It fails t when list fails.
func DeadLettersOf[T any](list func(ctx context.Context) ([]T, error), fields func(T) DeadLetter) func(t *testing.T) []DeadLetter {
	return func(t *testing.T) []DeadLetter {
		l, err := list(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		out := make([]DeadLetter, len(l))
		for i, d := range l {
			out[i] = fields(d)
		}
		return out
	}
}

// Run runs the suite against b: the per-queue tests in parallel, then the
// restart and outage tests one after the other.
func Run(t *testing.T, b Broker) {
	t.Run("queue", func(t *testing.T) {
		t.Run("PublishConsumeAck", func(t *testing.T) { t.Parallel(); publishConsumeAck(t, b.NewQueue(t)) })
		t.Run("DuplicatePublish", func(t *testing.T) { t.Parallel(); duplicatePublish(t, b.NewQueue(t)) })
		t.Run("CrashBeforeAck", func(t *testing.T) { t.Parallel(); crashBeforeAck(t, b.NewQueue(t)) })
		t.Run("PoisonDeadLettered", func(t *testing.T) { t.Parallel(); poison(t, b.NewQueue(t)) })
		t.Run("OrderKept", func(t *testing.T) { t.Parallel(); order(t, b.NewQueue(t)) })
	})
	t.Run("BrokerRestart", func(t *testing.T) { restart(t, b) })
	t.Run("BrokerDown", func(t *testing.T) { down(t, b) })
}

// msgs returns n messages with ids prefix0 … prefix<n-1>.
func msgs(prefix string, from, n int) []outbox.Message {
	out := make([]outbox.Message, n)
	for i := range out {
		id := prefix + strconv.Itoa(from+i)
		out[i] = outbox.Message{RowID: int64(from + i + 1), ID: id, Event: "test.event",
			Payload: []byte(`{"n":` + strconv.Itoa(from+i) + `}`), Headers: map[string]string{"traceparent": "tp-" + id}}
	}
	return out
}

func publish(t *testing.T, q Queue, ms []outbox.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := q.Publisher.Publish(ctx, ms); err != nil {
		t.Fatalf("publish %d messages: %v", len(ms), err)
	}
}

// collect fetches from src until want deliveries came or deadline passed,
// acking them when ack; it returns them in delivery order.
func collect(t *testing.T, src inbox.Source, want int, within time.Duration, ack bool) []inbox.Delivery {
	t.Helper()
	var got []inbox.Delivery
	end := time.Now().Add(within)
	for len(got) < want && time.Now().Before(end) {
		// Fetch returns by itself after its block time: a deadline of ours
		// could cut a read off mid-way, which is no broker's fault.
		ds, err := src.Fetch(context.Background(), want-len(got))
		if err != nil {
			t.Fatalf("fetch: %v", err)
		}
		if ack && len(ds) > 0 {
			refs := make([]string, len(ds))
			for i, d := range ds {
				refs[i] = d.Ref
			}
			if err := src.Ack(context.Background(), refs...); err != nil {
				t.Fatalf("ack: %v", err)
			}
		}
		got = append(got, ds...)
	}
	return got
}

// none checks that src hands out nothing more within d.
func none(t *testing.T, src inbox.Source, d time.Duration, what string) {
	t.Helper()
	if extra := collect(t, src, 1, d, true); len(extra) > 0 {
		t.Errorf("%s: delivered %s again", what, extra[0].ID)
	}
}

func ids(ds []inbox.Delivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.ID
	}
	return out
}

func wantIDs(ms []outbox.Message) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}

func publishConsumeAck(t *testing.T, q Queue) {
	ms := msgs("pca-", 0, 10)
	publish(t, q, ms)
	src := q.Source(t, "g", "c1")
	got := collect(t, src, len(ms), 10*time.Second, true)
	if !slices.Equal(ids(got), wantIDs(ms)) {
		t.Fatalf("delivered %v, want %v", ids(got), wantIDs(ms))
	}
	for i, d := range got {
		m := ms[i]
		if d.Err != nil || d.Name != m.Event || string(d.Payload) != string(m.Payload) || d.Headers["traceparent"] != m.Headers["traceparent"] || d.Ref == "" {
			t.Errorf("delivery %d = {Ref %q ID %q Name %q Payload %s Headers %v Err %v}, want message %+v", i, d.Ref, d.ID, d.Name, d.Payload, d.Headers, d.Err, m)
		}
	}
	// Acknowledged: neither this consumer nor another of the group gets
	// them again once the lock duration has passed; another group gets all.
	none(t, q.Source(t, "g", "c2"), q.LockDuration+time.Second, "acknowledged")
	if other := collect(t, q.Source(t, "g2", "c1"), len(ms), 10*time.Second, true); len(other) != len(ms) {
		t.Errorf("a second group got %d of %d", len(other), len(ms))
	}
}

func duplicatePublish(t *testing.T, q Queue) {
	ms := msgs("dup-", 0, 3)
	publish(t, q, ms)
	publish(t, q, ms)      // the relay's retry after an unknown outcome
	publish(t, q, ms[1:2]) // and a lone repeat
	src := q.Source(t, "g", "c1")
	got := collect(t, src, len(ms), 10*time.Second, true)
	none(t, src, time.Second, "a duplicate publish")
	if !slices.Equal(ids(got), wantIDs(ms)) {
		t.Fatalf("delivered %v, want %v once each", ids(got), wantIDs(ms))
	}
}

func crashBeforeAck(t *testing.T, q Queue) {
	ms := msgs("crash-", 0, 4)
	publish(t, q, ms)
	first := collect(t, q.Source(t, "g", "dies"), len(ms), 10*time.Second, false) // never acks
	if len(first) != len(ms) {
		t.Fatalf("first consumer got %d of %d", len(first), len(ms))
	}
	heir := q.Source(t, "g", "heir")
	got := collect(t, heir, len(ms), q.LockDuration+10*time.Second, true)
	if !slices.Equal(ids(got), wantIDs(ms)) {
		t.Fatalf("after the lock duration the heir got %v, want %v", ids(got), wantIDs(ms))
	}
	none(t, heir, q.LockDuration+time.Second, "acknowledged by the heir")
}

func poison(t *testing.T, q Queue) {
	ms := msgs("poison-", 0, 3)
	publish(t, q, ms)
	src := q.Source(t, "g", "c1")
	got := collect(t, src, len(ms), 10*time.Second, false)
	if len(got) != len(ms) {
		t.Fatalf("got %d of %d", len(got), len(ms))
	}
	if err := src.DeadLetter(context.Background(), got[1], "malformed: test"); err != nil {
		t.Fatalf("dead-letter: %v", err)
	}
	if err := src.Ack(context.Background(), got[0].Ref, got[2].Ref); err != nil {
		t.Fatalf("ack: %v", err)
	}
	none(t, q.Source(t, "g", "c2"), q.LockDuration+time.Second, "dead-lettered or acknowledged")
	var dls []DeadLetter
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if dls = q.DeadLetters(t); len(dls) > 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(dls) != 1 || dls[0].ID != ms[1].ID || dls[0].Reason != "malformed: test" {
		t.Fatalf("dead letters %+v, want one for %s with its reason", dls, ms[1].ID)
	}
}

func order(t *testing.T, q Queue) {
	const n, batch = 200, 20
	for i := 0; i < n; i += batch {
		publish(t, q, msgs("ord-", i, batch))
	}
	got := collect(t, q.Source(t, "g", "c1"), n, 20*time.Second, true)
	if want := wantIDs(msgs("ord-", 0, n)); !slices.Equal(ids(got), want) {
		t.Fatalf("delivered %d in order %v…, want %v…", len(got), head(ids(got)), head(want))
	}
}

func head(s []string) []string { return s[:min(len(s), 5)] }

func restart(t *testing.T, b Broker) {
	q := b.NewQueue(t)
	ms := msgs("restart-", 0, 6)
	publish(t, q, ms)
	src := q.Source(t, "g", "c1")
	acked := collect(t, src, 2, 10*time.Second, true)
	if len(acked) != 2 {
		t.Fatalf("got %d of 2 before the restart", len(acked))
	}
	b.Stop(t)
	b.Start(t)
	after := q.Source(t, "g", "c2")
	got := collect(t, after, len(ms)-2, q.LockDuration+20*time.Second, true)
	if want := wantIDs(ms[2:]); !slices.Equal(ids(got), want) {
		t.Fatalf("after the restart: %v, want %v (the acknowledged %v not again)", ids(got), want, ids(acked))
	}
	none(t, after, q.LockDuration+time.Second, "acknowledged before or after the restart")
}

func down(t *testing.T, b Broker) {
	q := b.NewQueue(t)
	ms := msgs("down-", 0, 3)
	b.Stop(t)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	err := q.Publisher.Publish(ctx, ms)
	cancel()
	took := time.Since(start)
	b.Start(t)
	if err == nil {
		t.Fatal("Publish with the broker down returned nil")
	}
	if took > 4*time.Second {
		t.Fatalf("Publish with the broker down took %v past a 3 s deadline", took)
	}
	var me *outbox.MessageError
	if errors.As(err, &me) {
		t.Fatalf("broker down reported as message %d's own fault (it would park the row): %v", me.RowID, err)
	}
	// What failed is published again by the relay's next pass; once.
	var perr error
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		perr = q.Publisher.Publish(ctx, ms)
		cancel()
		if perr == nil {
			break
		}
	}
	if perr != nil {
		t.Fatalf("publish after the broker came back: %v", perr)
	}
	src := q.Source(t, "g", "c1")
	got := collect(t, src, len(ms), 20*time.Second, true)
	none(t, src, time.Second, "published during and after the outage")
	if !slices.Equal(ids(got), wantIDs(ms)) {
		t.Fatalf("after the outage: %v, want %v once each", ids(got), wantIDs(ms))
	}
}
