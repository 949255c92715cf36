package natsq_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/natsq"
	"github.com/outboxchat/outboxchat/outbox"
)

// A message the server can never take (over its max payload) is the row's
// own fault: the rows before it are published, it is named for the relay
// to park, and nothing after it is sent.
func TestOversizeMessageIsTheRowsFault(t *testing.T) {
	_, nc := startNATS(t)
	ctx := context.Background()
	q := newQueue(t, nc, natsq.Config{Queue: "big", Prefix: "t_"})
	huge := []byte(`"` + strings.Repeat("x", int(nc.MaxPayload())) + `"`)
	err := natsq.OutboxPublisher(q).Publish(ctx, []outbox.Message{
		{RowID: 1, ID: "a", Event: "e", Payload: []byte(`1`)},
		{RowID: 2, ID: "b", Event: "e", Payload: huge},
		{RowID: 3, ID: "c", Event: "e", Payload: []byte(`3`)},
	})
	var me *outbox.MessageError
	if !errors.As(err, &me) || me.RowID != 2 || !errors.Is(err, natsq.ErrInvalidEvent) {
		t.Fatalf("publish: %v, want a MessageError for row 2", err)
	}
	c := newConsumer(t, q, natsq.ConsumerConfig{Group: "g", FetchWait: 200 * time.Millisecond})
	ds, err := c.Fetch(ctx, 10)
	if err != nil || len(ds) != 1 || ds[0].ID != "a" {
		t.Fatalf("fetched %+v, %v; want a alone", ds, err)
	}
}

// An event not published by natsq (no Nats-Msg-Id) reaches the inbox as
// malformed, for it to dead-letter, instead of as an event without an id.
func TestEventWithoutIDIsMalformed(t *testing.T) {
	_, nc := startNATS(t)
	ctx := context.Background()
	q := newQueue(t, nc, natsq.Config{Queue: "raw"})
	if err := nc.Publish("raw.events", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	c := newConsumer(t, q, natsq.ConsumerConfig{Group: "g", FetchWait: time.Second})
	ds, err := natsq.InboxSource(c).Fetch(ctx, 10)
	if err != nil || len(ds) != 1 || !errors.Is(ds[0].Err, inbox.ErrMalformed) {
		t.Fatalf("fetched %+v, %v; want one malformed delivery", ds, err)
	}
}

func TestConfigErrors(t *testing.T) {
	_, nc := startNATS(t)
	for _, cfg := range []natsq.Config{{}, {Queue: "a.b"}, {Queue: "q", Prefix: "x>"}} {
		if _, err := natsq.New(context.Background(), nc, cfg); !errors.Is(err, natsq.ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
}

// An event whose consumers never acknowledge it (a crash loop) is moved to
// the dead-letter stream once it was delivered MaxDeliver times, and the
// group goes on without it.
func TestMaxDeliverDeadLetters(t *testing.T) {
	_, nc := startNATS(t)
	ctx := context.Background()
	q := newQueue(t, nc, natsq.Config{Queue: "loop"})
	if err := q.Publish(ctx, natsq.Event{ID: "crashes", Name: "e", Payload: []byte(`1`)}); err != nil {
		t.Fatal(err)
	}
	const lock = 300 * time.Millisecond
	c := newConsumer(t, q, natsq.ConsumerConfig{Group: "g", LockDuration: lock, MaxDeliver: 2, FetchWait: 2 * lock})
	var delivered int
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		ds, err := c.Fetch(ctx, 10) // never acked: each is a crashed attempt
		if err != nil {
			t.Fatal(err)
		}
		delivered += len(ds)
		if dls, err := q.DeadLetters(ctx, 0, 10); err != nil {
			t.Fatal(err)
		} else if len(dls) > 0 {
			if len(dls) != 1 || dls[0].ID != "crashes" || dls[0].Reason != "delivered 2 times without an ack" || dls[0].StreamSeq != 1 {
				t.Fatalf("dead letters %+v", dls)
			}
			break
		}
	}
	if delivered != 2 {
		t.Fatalf("handed out %d times before the dead letter, want MaxDeliver = 2", delivered)
	}
	if ds, err := c.Fetch(ctx, 10); err != nil || len(ds) != 0 {
		t.Fatalf("after the dead letter: %+v, %v; want nothing", ds, err)
	}
}

// Republish stores events again inside the duplicate window, where a
// Publish of the same ids adds nothing; consumers see the event's own id
// on every copy, so the inbox drops the copies it has.
func TestRepublishPastTheDuplicateWindow(t *testing.T) {
	_, nc := startNATS(t)
	ctx := context.Background()
	q := newQueue(t, nc, natsq.Config{Queue: "redo"})
	ev := natsq.Event{ID: "m1", Name: "e", Payload: []byte(`1`)}
	for range 2 {
		if err := q.Publish(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.Republish(ctx, ev); err != nil {
		t.Fatal(err)
	}
	c := newConsumer(t, q, natsq.ConsumerConfig{Group: "g", FetchWait: 300 * time.Millisecond})
	ds, err := c.Fetch(ctx, 10)
	if err != nil || len(ds) != 2 {
		t.Fatalf("fetched %+v, %v; want the first publish and the republish", ds, err)
	}
	for _, d := range ds {
		if d.ID != "m1" {
			t.Errorf("copy at stream seq %d has id %q, want m1", d.StreamSeq, d.ID)
		}
	}
}

// Config.Sign's signature travels with the event to the inbox's
// Delivery.Sig, on a publish, a republish and a dead letter alike.
func TestSignatureCarried(t *testing.T) {
	_, nc := startNATS(t)
	ctx := context.Background()
	sign := func(e natsq.Event) string { return "sig:" + e.ID + ":" + string(e.Payload) }
	q := newQueue(t, nc, natsq.Config{Queue: "signed", Sign: sign})
	if err := q.Publish(ctx, natsq.Event{ID: "a", Name: "e", Payload: []byte(`1`)}); err != nil {
		t.Fatal(err)
	}
	if err := q.Republish(ctx, natsq.Event{ID: "b", Name: "e", Payload: []byte(`2`)}); err != nil {
		t.Fatal(err)
	}
	c := newConsumer(t, q, natsq.ConsumerConfig{Group: "g", FetchWait: 300 * time.Millisecond})
	src := natsq.InboxSource(c)
	ds, err := src.Fetch(ctx, 10)
	if err != nil || len(ds) != 2 {
		t.Fatalf("fetched %+v, %v", ds, err)
	}
	for _, d := range ds {
		if want := "sig:" + d.ID + ":" + string(d.Payload); d.Sig != want {
			t.Errorf("%s: sig %q, want %q", d.ID, d.Sig, want)
		}
	}
	if err := src.DeadLetter(ctx, ds[1], "test"); err != nil {
		t.Fatal(err)
	}
	dls, err := q.DeadLetters(ctx, 0, 10)
	if err != nil || len(dls) != 1 || dls[0].ID != "b" || dls[0].Sig != "sig:b:2" {
		t.Fatalf("dead letters %+v, %v; want b with its signature", dls, err)
	}
}

// Replay puts a dead letter back on the stream, signature and headers
// kept, under a fresh Nats-Msg-Id (the first copy is inside the duplicate
// window) and removes it from the dead-letter stream; a second replay, or
// a drop of what is gone, reports it not done. Open sees the same streams
// and changes nothing.
func TestReplayAndDropDeadLetters(t *testing.T) {
	_, nc := startNATS(t)
	ctx := context.Background()
	if _, err := natsq.Open(ctx, nc, natsq.Config{Queue: "dl"}); err == nil {
		t.Fatal("Open of a queue never made: no error")
	}
	if _, err := natsq.New(ctx, nc, natsq.Config{Queue: "dl", MaxAge: time.Hour}); err != nil {
		t.Fatal(err)
	}
	q, err := natsq.Open(ctx, nc, natsq.Config{Queue: "dl"})
	if err != nil {
		t.Fatal(err)
	}
	ev := natsq.Event{ID: "m1", Name: "e", Payload: []byte(`{"n":1}`), Headers: map[string]string{"trace": "t1"}, Sig: "sig-1"}
	if err := q.Publish(ctx, ev, natsq.Event{ID: "m2", Name: "e", Payload: []byte(`2`)}); err != nil {
		t.Fatal(err)
	}
	c := newConsumer(t, q, natsq.ConsumerConfig{Group: "g", FetchWait: 300 * time.Millisecond})
	ds, err := c.Fetch(ctx, 10)
	if err != nil || len(ds) != 2 {
		t.Fatalf("fetched %+v, %v", ds, err)
	}
	for _, d := range ds {
		if err := c.DeadLetter(ctx, d, "poison"); err != nil {
			t.Fatal(err)
		}
	}
	dls, err := q.DeadLetters(ctx, 0, 10)
	if err != nil || len(dls) != 2 {
		t.Fatalf("dead letters %+v, %v; want 2", dls, err)
	}
	done, err := q.Replay(ctx, dls[0].Seq)
	if err != nil || len(done) != 1 || !done[0] {
		t.Fatalf("replay: %v, %v", done, err)
	}
	if again, err := q.Replay(ctx, dls[0].Seq); err != nil || again[0] {
		t.Fatalf("second replay: %v, %v; want not done", again, err)
	}
	back, err := c.Fetch(ctx, 10)
	if err != nil || len(back) != 1 {
		t.Fatalf("after the replay fetched %+v, %v; want the one event", back, err)
	}
	if b := back[0]; b.ID != "m1" || string(b.Payload) != `{"n":1}` || b.Sig != "sig-1" || b.Headers["trace"] != "t1" {
		t.Fatalf("replayed as %+v", b.Event)
	}
	if ok, err := q.DropDeadLetter(ctx, dls[1].Seq); err != nil || !ok {
		t.Fatalf("drop: %v, %v", ok, err)
	}
	if ok, err := q.DropDeadLetter(ctx, dls[1].Seq); err != nil || ok {
		t.Fatalf("second drop: %v, %v; want not done", ok, err)
	}
	if left, err := q.DeadLetters(ctx, 0, 10); err != nil || len(left) != 0 {
		t.Fatalf("dead letters left %+v, %v; want none", left, err)
	}
	if _, ok, err := q.DeadLetterAt(ctx, dls[0].Seq); err != nil || ok {
		t.Fatalf("DeadLetterAt a replayed seq: %v, %v; want none", ok, err)
	}
}

// A Fetch waiting on an empty queue returns when its ctx is cancelled (an
// inbox consumer's Stop), not at the end of FetchWait; one whose FetchWait
// runs out returns nothing and no error.
func TestFetchWaitEndsWithCtx(t *testing.T) {
	_, nc := startNATS(t)
	q := newQueue(t, nc, natsq.Config{Queue: "idle"})
	const wait = 30 * time.Second
	c := newConsumer(t, q, natsq.ConsumerConfig{Group: "g", FetchWait: wait})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := c.Fetch(ctx, 10)
		done <- err
	}()
	// Cancelled once the Fetch is likely past its first look and waiting;
	// cancelled before, it returns ctx's error all the same.
	time.AfterFunc(200*time.Millisecond, cancel)
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Fetch after cancel: %v, want context.Canceled", err)
		}
	case <-time.After(wait / 2):
		t.Fatal("Fetch still waiting after its ctx was cancelled")
	}
	short := newConsumer(t, q, natsq.ConsumerConfig{Group: "short", FetchWait: 200 * time.Millisecond})
	if ds, err := short.Fetch(context.Background(), 10); err != nil || len(ds) != 0 {
		t.Fatalf("Fetch whose wait ran out: %+v, %v; want nothing and no error", ds, err)
	}
}
