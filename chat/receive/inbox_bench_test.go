package receive

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/inbox"
)

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
