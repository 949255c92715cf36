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
	q, err := natsq.New(ctx, nc, natsq.Config{Queue: "big", Prefix: "t_"})
	if err != nil {
		t.Fatal(err)
	}
	huge := []byte(`"` + strings.Repeat("x", int(nc.MaxPayload())) + `"`)
	err = natsq.OutboxPublisher(q).Publish(ctx, []outbox.Message{
		{RowID: 1, ID: "a", Event: "e", Payload: []byte(`1`)},
		{RowID: 2, ID: "b", Event: "e", Payload: huge},
		{RowID: 3, ID: "c", Event: "e", Payload: []byte(`3`)},
	})
	var me *outbox.MessageError
	if !errors.As(err, &me) || me.RowID != 2 || !errors.Is(err, natsq.ErrInvalidEvent) {
		t.Fatalf("publish: %v, want a MessageError for row 2", err)
	}
	c, err := q.NewConsumer(ctx, natsq.ConsumerConfig{Group: "g", FetchWait: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
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
	q, err := natsq.New(ctx, nc, natsq.Config{Queue: "raw"})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish("raw.events", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	c, err := q.NewConsumer(ctx, natsq.ConsumerConfig{Group: "g", FetchWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
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
