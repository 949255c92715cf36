package receive

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"fmt"
	"io"
	"log/slog"
	"net/url"

	"github.com/jackc/pgx/v5"
	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/inbox"
)

// recordingSource remembers what was acked and dead-lettered.
type recordingSource struct {
	mu         sync.Mutex
	acked      []string
	deadLetter []string
}

func (s *recordingSource) Fetch(context.Context, int) ([]inbox.Delivery, error) { return nil, nil }
func (s *recordingSource) Ack(_ context.Context, refs ...string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.acked = append(s.acked, refs...)
	return nil
}
func (s *recordingSource) DeadLetter(_ context.Context, d inbox.Delivery, _ string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.deadLetter = append(s.deadLetter, d.Ref)
	return nil
}

// One batch mixing a new message, a malformed job, the same message again,
// a message already in the inbox and another new one: the batch path has the
// effect of Apply on each in order. In pgx's default query mode and in the
// two a transaction-mode pooler needs (exec, simple_protocol), whose
// parameters go as text with no type from the server.
func TestInboxHandlerBatchMixedDeliveries(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"", "exec", "simple_protocol"} {
		t.Run("mode="+mode, func(t *testing.T) {
			t.Parallel()
			testInboxHandlerBatchMixedDeliveries(t, mode)
		})
	}
}

func testInboxHandlerBatchMixedDeliveries(t *testing.T, mode string) {
	h := chattest.New(t, "")
	ctx := context.Background()
	_, _, c, src := inboxConsumerMode(t, h, chat.Workers, nil, mode)
	mk := func(seq int64) inbox.Delivery {
		id := uuid.NewString()
		p, _ := json.Marshal(chat.Message{ID: id, ChatID: 2, Seq: seq, Body: "b", SentAt: time.Now(), From: chat.Consumers})
		return inbox.Delivery{ID: id, Name: chat.EventMessageCreated, Payload: p}
	}
	old := mk(1)
	old.Ref = "0-1"
	if err := c.ProcessBatch(ctx, []inbox.Delivery{old}); err != nil {
		t.Fatal(err)
	}
	a, b := mk(2), mk(3)
	ds := []inbox.Delivery{a, {ID: "x", Payload: []byte(`{nope`)}, a, old, b}
	for i := range ds {
		ds[i].Ref = "1-" + string(rune('a'+i))
	}
	if err := c.ProcessBatch(ctx, ds); err != nil {
		t.Fatal(err)
	}
	st := c.Stats()
	if st.Applied != 3 || st.Duplicates != 2 || st.DeadLettered != 1 {
		t.Fatalf("stats %+v, want applied 3 (1 earlier + 2), duplicates 2, dead-lettered 1", st)
	}
	if n := h.Count(t, `SELECT count(*) FROM workers.inbox`); n != 3 {
		t.Fatalf("inbox rows %d, want 3", n)
	}
	if n := h.Count(t, `SELECT count(*) FROM workers.inbox_duplicates`); n != 2 {
		t.Fatalf("duplicates recorded %d, want 2", n)
	}
	if len(src.acked) != 5 || len(src.deadLetter) != 1 || src.deadLetter[0] != "1-b" {
		t.Fatalf("acked %v, dead-lettered %v", src.acked, src.deadLetter)
	}
}

// inboxConsumer is service's InboxHandler behind an inbox.Consumer on a
// role pool of h, fed by a recordingSource; cfg may be nil.
func inboxConsumer(t testing.TB, h *chattest.Harness, service string, cfg *inbox.Config) (*pgxpool.Pool, *InboxHandler, *inbox.Consumer, *recordingSource) {
	t.Helper()
	return inboxConsumerMode(t, h, service, cfg, "")
}

// inboxConsumerMode is inboxConsumer on a pool in pgx query mode mode
// (default_query_exec_mode; "": pgx's default).
func inboxConsumerMode(t testing.TB, h *chattest.Harness, service string, cfg *inbox.Config, mode string) (*pgxpool.Pool, *InboxHandler, *inbox.Consumer, *recordingSource) {
	t.Helper()
	pool := h.RolePool(t, service)
	if mode != "" {
		u, err := url.Parse(h.RoleURL(service))
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Set("default_query_exec_mode", mode)
		u.RawQuery = q.Encode()
		pool, err = pgxpool.New(context.Background(), u.String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
	}
	ih, err := NewInboxHandler(service, nil)
	if err != nil {
		t.Fatal(err)
	}
	src := &recordingSource{}
	c, err := inbox.NewConsumer(pool, src, ih, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return pool, ih, c, src
}

// nopSource acknowledges nothing: the benchmark measures the inbox
// transaction, not Redis.
type nopSource struct{}

func (nopSource) Fetch(context.Context, int) ([]inbox.Delivery, error)     { return nil, nil }
func (nopSource) Ack(context.Context, ...string) error                     { return nil }
func (nopSource) DeadLetter(context.Context, inbox.Delivery, string) error { return nil }

// BenchmarkInboxBatch100 applies 100 fresh message.created deliveries in one
// inbox transaction with the chat's handler: "per-delivery" calls Apply once
// per delivery (one round trip each), "batch" uses ApplyBatch when the
// handler has it (one statement for the batch).
func BenchmarkInboxBatch100(b *testing.B) {
	h := chattest.New(b, "")
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, h.RoleURL(chat.Workers))
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	ih, err := NewInboxHandler(chat.Workers, nil)
	if err != nil {
		b.Fatal(err)
	}
	handlers := map[string]inbox.Handler{
		"per-delivery": inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, d inbox.Delivery) (bool, error) { return ih.Apply(ctx, tx, d) }),
		"batch":        ih,
	}
	var seq int64
	for _, name := range []string{"per-delivery", "batch"} {
		b.Run(name, func(b *testing.B) {
			c, err := inbox.NewConsumer(pool, nopSource{}, handlers[name], &inbox.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				b.Fatal(err)
			}
			ds := make([]inbox.Delivery, 100)
			b.ResetTimer()
			for range b.N {
				for i := range ds {
					seq++
					id := uuid.NewString()
					p, _ := json.Marshal(chat.Message{ID: id, ChatID: 1 + seq%100, Seq: seq, Body: "bench", SentAt: time.Now(), From: chat.Consumers})
					ds[i] = inbox.Delivery{Ref: fmt.Sprint(seq), ID: id, Name: chat.EventMessageCreated, Payload: p}
				}
				if err := c.ProcessBatch(ctx, ds); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(100*b.N), "ns/delivery")
		})
	}
}
