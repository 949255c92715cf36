package store

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/outbox"
)

// TestFenceFencesANewIncarnationOnce: the Publisher raises the Redis
// high-water marks of what it publishes; on a database incarnation not
// fenced yet (seq_epochs holds only another one: as after a promotion),
// Check records, for the chat whose mark is above its rows, a floor at
// the mark, the seqs in between as lost, and one seq.floor event; the
// next send goes above the mark; a second Check, and one from another
// Fence, do nothing more. A Fence without Redis refuses an unfenced
// incarnation (ErrNotFenced).
func TestFenceFencesANewIncarnationOnce(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t, outbox.WakeAfterCommit)
	ctx := context.Background()
	rdb := testenv.Redis(t)
	prefix := testenv.Prefix(t)
	for range 2 {
		if _, err := e.store.Send(ctx, 5, "b", ""); err != nil {
			t.Fatal(err)
		}
	}
	f, err := NewFence(rdb, prefix, chat.Consumers, nil)
	if err != nil {
		t.Fatal(err)
	}
	w, err := outbox.NewWriter(e.store.pool, &outbox.WriterConfig{Table: "consumers.outbox", Mode: outbox.WakeInTx})
	if err != nil {
		t.Fatal(err)
	}
	f.SetWriter(w)
	// Published (the mark says 9) and then lost with the old primary.
	var published []outbox.Message
	pub := f.Publisher(outbox.PublisherFunc(func(_ context.Context, ms []outbox.Message) error {
		published = append(published, ms...)
		return nil
	}))
	if err := pub.Publish(ctx, []outbox.Message{
		{Event: chat.EventMessageCreated, Payload: []byte(`{"chat_id": 5, "seq": 9, "body": "x"}`)},
		{Event: chat.EventMessageCreated, Payload: []byte(`{"chat_id": 5, "seq": 7, "body": "x"}`)},
		{Event: chat.EventMessageCreated, Payload: []byte(`{"chat_id": 6, "seq": 1, "body": "x"}`)},
	}); err != nil || len(published) != 3 {
		t.Fatalf("publish: %v, %d passed on", err, len(published))
	}
	if _, err := e.h.Admin.Exec(ctx, `DELETE FROM consumers.seq_epochs;
		INSERT INTO consumers.seq_epochs (system_id, timeline) VALUES ('another cluster', 1)`); err != nil {
		t.Fatal(err)
	}
	check := func(f *Fence) error {
		return e.store.pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error { return f.Check(ctx, c.Conn()) })
	}
	noRedis, err := NewFence(nil, prefix, chat.Consumers, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := check(noRedis); !errors.Is(err, ErrNotFenced) {
		t.Fatalf("Check without Redis on an unfenced incarnation: %v, want ErrNotFenced", err)
	}
	for range 2 {
		if err := check(f); err != nil {
			t.Fatal(err)
		}
	}
	if err := check(noRedis); err != nil {
		t.Fatalf("Check without Redis once fenced: %v", err)
	}
	if n := e.h.Count(t, `SELECT count(*) FROM consumers.seq_lost WHERE chat_id = 5 AND from_seq = 3 AND to_seq = 9`); n != 1 {
		t.Errorf("seq_lost rows for chat 5 seqs 3..9: %d, want 1", n)
	}
	// Chat 6 has no rows at all: its published seq 1 is lost too.
	if n := e.h.Count(t, `SELECT count(*) FROM consumers.seq_lost WHERE chat_id = 6 AND from_seq = 1 AND to_seq = 1`); n != 1 {
		t.Errorf("seq_lost rows for chat 6 seq 1: %d, want 1", n)
	}
	if n := e.h.Count(t, `SELECT count(*) FROM consumers.seq_lost`); n != 2 {
		t.Errorf("seq_lost rows: %d, want 2 (a second Check fenced again?)", n)
	}
	if n := e.h.Count(t, `SELECT count(*) FROM consumers.outbox WHERE event = $1
		AND payload @> '{"chats": [{"chat_id": 5, "upto_seq": 9}]}'`, chat.EventSeqFloor); n != 1 {
		t.Errorf("seq.floor events for chat 5 up to 9: %d, want 1", n)
	}
	m, err := e.store.Send(ctx, 5, "after", "")
	if err != nil {
		t.Fatal(err)
	}
	if m.Seq != 10 {
		t.Errorf("send after the fence: seq %d, want 10 (above the mark)", m.Seq)
	}
}
