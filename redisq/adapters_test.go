package redisq_test

import (
	"context"
	"testing"

	"github.com/outboxchat/outboxchat/outbox"
	"github.com/outboxchat/outboxchat/redisq"
)

// The adapters carry a relay's messages to an inbox consumer unchanged:
// ids, names and payloads in order, a re-publish adds nothing, Ack settles
// and DeadLetter moves the entry with its reason.
func TestAdaptersRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t, nil)
	pub := redisq.OutboxPublisher(q.pub)
	msgs := []outbox.Message{
		{ID: "m1", Event: "message.created", Payload: []byte(`{"n":1}`)},
		{ID: "m2", Event: "message.created", Payload: []byte(`{"n":2}`)},
	}
	for range 2 { // the second publish is a relay's re-send: no new entries
		if err := pub.Publish(ctx, msgs); err != nil {
			t.Fatal(err)
		}
	}
	src := redisq.InboxSource(q.consumer(t, "w1", nil))
	ds, err := src.Fetch(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 2 {
		t.Fatalf("fetched %d deliveries, want 2 (the re-publish must add nothing)", len(ds))
	}
	for i, d := range ds {
		m := msgs[i]
		if d.ID != m.ID || d.Name != m.Event || string(d.Payload) != string(m.Payload) || d.Ref == "" || d.Err != nil {
			t.Fatalf("delivery %d = %+v, want the fields of %+v and a stream id", i, d, m)
		}
	}
	if err := src.Ack(ctx, ds[0].Ref); err != nil {
		t.Fatal(err)
	}
	if err := src.DeadLetter(ctx, ds[1], "poison"); err != nil {
		t.Fatal(err)
	}
	dead := q.rdb.XRange(ctx, q.keys.Dead, "-", "+").Val()
	if len(dead) != 1 || dead[0].Values["reason"] != "poison" || dead[0].Values["id"] != "m2" {
		t.Fatalf("dead letters %+v", dead)
	}
	if n := q.rdb.XPending(ctx, q.keys.Stream, "workers").Val().Count; n != 0 {
		t.Fatalf("%d entries still pending", n)
	}
}
