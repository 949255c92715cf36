package chat

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/outbox"
)

// BenchmarkSend measures one send transaction (chat counter, message, outbox
// row, commit) per op, on the private Postgres, for each wake-up mode.
// Parallel: concurrent senders spread over 100 chats.
func BenchmarkSend(b *testing.B) {
	for _, mode := range []outbox.WakeMode{outbox.WakeAfterCommit, outbox.WakeInTx} {
		b.Run(mode.String(), func(b *testing.B) {
			h := newHarness(b, "")
			ctx := context.Background()
			pool, err := pgxpool.New(ctx, h.roleURL(Consumers))
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
			s, err := NewStore(pool, Consumers, w)
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				var i int64
				for pb.Next() {
					i++
					if _, err := s.Send(ctx, 1+i%100, "benchmark message"); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
