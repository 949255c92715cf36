package outbox_test

import (
	"context"
	"strconv"
	"sync"
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
// Publisher (claim, publish, delete the published rows, commit); refilling is not timed.
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

// BenchmarkRelayGroup measures the passes of 4 relays, each over its own
// table of 25 rows, started together: "alone" each pass a transaction of
// its own, "group" in a RelayGroup (the passes that start while one is in
// flight share the next). It reports the transactions per op. Refilling is
// not timed.
func BenchmarkRelayGroup(b *testing.B) {
	const tables, rows = 4, 25
	for _, grouped := range []bool{false, true} {
		name := "alone"
		if grouped {
			name = "group"
		}
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			pool := setup(b)
			var g *outbox.RelayGroup
			if grouped {
				var err error
				if g, err = outbox.NewRelayGroup(pool); err != nil {
					b.Fatal(err)
				}
			}
			nop := outbox.PublisherFunc(func(context.Context, []outbox.Message) error { return nil })
			ws := make([]*outbox.Writer, tables)
			rs := make([]*outbox.Relay, tables)
			for i := range tables {
				table := testTable
				if i > 0 {
					table = "ob.outbox_p" + strconv.Itoa(i)
					if _, err := pool.Exec(ctx, outbox.TableDDL(table)); err != nil {
						b.Fatal(err)
					}
				}
				var err error
				if ws[i], err = outbox.NewWriter(pool, &outbox.WriterConfig{Table: table, Mode: outbox.WakeNone}); err != nil {
					b.Fatal(err)
				}
				rs[i] = newRelay(b, pool, outbox.RelayConfig{Table: table, Publisher: nop, Group: g})
			}
			payload := []byte(`{"chat_id":1,"seq":1,"body":"hello"}`)
			events := make([]outbox.Event, rows)
			id := 0
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				for _, w := range ws {
					for i := range events {
						id++
						events[i] = outbox.Event{ID: strconv.Itoa(id), Name: "message.created", Payload: payload}
					}
					enqueue(b, pool, w, events...)
				}
				b.StartTimer()
				var wg sync.WaitGroup
				for _, r := range rs {
					wg.Go(func() {
						if n, err := r.RunOnce(ctx); err != nil || n != rows {
							b.Errorf("RunOnce = %d, %v", n, err)
						}
					})
				}
				wg.Wait()
			}
			b.StopTimer()
			txs := float64(tables)
			if g != nil {
				txs = float64(g.Stats().Transactions) / float64(b.N)
			}
			b.ReportMetric(txs, "tx/op")
		})
	}
}
