package outbox_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/outbox"
)

// BenchmarkEnqueue measures one transaction with one event: BEGIN, INSERT,
// COMMIT, Committed.
func BenchmarkEnqueue(b *testing.B) {
	for _, mode := range []outbox.WakeMode{outbox.WakeAfterCommit, outbox.WakeInTx} {
		b.Run(mode.String(), func(b *testing.B) {
			ctx := context.Background()
			pool := setup(b)
			w := newWriter(b, pool, mode)
			payload := []byte(`{"chat_id":1,"seq":1,"body":"hello"}`)
			i := 0
			for b.Loop() {
				i++
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					return w.Enqueue(ctx, tx, outbox.Event{ID: strconv.Itoa(i), Name: "message.created", Payload: payload})
				})
				if err != nil {
					b.Fatal(err)
				}
				w.Committed()
			}
		})
	}
}

// BenchmarkRunOnce100 measures one relay pass over 100 rows with a no-op
// Publisher (claim, publish, mark sent, commit); refilling is not timed.
func BenchmarkRunOnce100(b *testing.B) {
	ctx := context.Background()
	pool := setup(b)
	w := newWriter(b, pool, outbox.WakeNone)
	r := newRelay(b, pool, outbox.RelayConfig{Publisher: outbox.PublisherFunc(func(context.Context, []outbox.Message) error { return nil })})
	events := make([]outbox.Event, 100)
	payload := []byte(`{"chat_id":1,"seq":1,"body":"hello"}`)
	id := 0
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		for i := range events {
			id++
			events[i] = outbox.Event{ID: strconv.Itoa(id), Name: "message.created", Payload: payload}
		}
		enqueue(b, pool, w, events...)
		b.StartTimer()
		n, err := r.RunOnce(ctx)
		if err != nil || n != 100 {
			b.Fatalf("RunOnce = %d, %v", n, err)
		}
	}
}
