package store

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/outbox"
)

// BenchmarkSend measures Store.Send (chat counter, message, outbox row,
// commit) per op, on the private Postgres, for each wake-up mode, with the
// group committer started ("batched") and without it ("alone": one
// transaction per send, in the caller's goroutine). Parallel: 8 senders per
// core spread over 100 chats; msgs/tx is the mean batch size. The "keyed"
// runs give every send an idempotency key, as a WebSocket send's client_id
// does (the key's lookup and its unique index entry).
func BenchmarkSend(b *testing.B) {
	for _, mode := range []outbox.WakeMode{outbox.WakeAfterCommit, outbox.WakeInTx} {
		for _, batched := range []bool{true, false} {
			for _, keyed := range []bool{false, true} {
				name := mode.String() + "/alone"
				if batched {
					name = mode.String() + "/batched"
				}
				if keyed {
					name += "/keyed"
				}
				b.Run(name, func(b *testing.B) { benchmarkSend(b, mode, batched, keyed) })
			}
		}
	}
}

func benchmarkSend(b *testing.B, mode outbox.WakeMode, batched, keyed bool) {
	h := chattest.New(b, "")
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, h.RoleURL(chat.Consumers))
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	w, err := outbox.NewWriter(pool, &outbox.WriterConfig{Table: "consumers.outbox", Mode: mode})
	if err != nil {
		b.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer w.Stop(ctx)
	s, err := New(pool, &Config{Service: chat.Consumers, Writer: w})
	if err != nil {
		b.Fatal(err)
	}
	if batched {
		if err := s.Start(ctx); err != nil {
			b.Fatal(err)
		}
		defer s.Stop(ctx)
	}
	b.SetParallelism(8)
	b.ResetTimer()
	var senders atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		prefix := "s" + strconv.FormatInt(senders.Add(1), 10) + "-"
		var i int64
		for pb.Next() {
			i++
			key := ""
			if keyed {
				key = prefix + strconv.FormatInt(i, 10)
			}
			if _, _, err := s.SendIdempotent(ctx, 1+i%100, "benchmark message", key, ""); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	var msgs, txs float64
	if err := h.Admin.QueryRow(ctx, `SELECT count(*), count(DISTINCT xmin::text) FROM consumers.messages`).Scan(&msgs, &txs); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(msgs/txs, "msgs/tx")
}
