package inbox_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/redisq"
)

// BenchmarkProcessBatch100 applies 100 fresh deliveries in one transaction
// and acks them (real Postgres and Redis). Enqueueing and fetching are not
// timed.
func BenchmarkProcessBatch100(b *testing.B) {
	const n = 100
	e := newEnv(b)
	src := e.source(b, "bench")
	c, err := inbox.NewConsumer(e.pool, src, testHandler, &inbox.Config{Logger: e.log})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	jobs := make([]redisq.Job, n)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		for i := range jobs {
			jobs[i] = job("bench")
		}
		e.add(b, jobs...)
		ds := fetchAll(b, src, n)
		b.StartTimer()
		if err := c.ProcessBatch(ctx, ds); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if got := c.Stats().Applied; got != int64(n*b.N) {
		b.Fatalf("Applied = %d, want %d", got, n*b.N)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n*b.N), "ns/delivery")
}

// BenchmarkGroup applies the batches of 4 consumers (25 fresh deliveries
// each) started together: "alone" each batch a pipelined transaction of its
// own, "group" in a Group whose handlers merge (one INSERT for the batches
// that share a transaction). It reports the transactions per op. Enqueueing
// and fetching are not timed.
func BenchmarkGroup(b *testing.B) {
	const members, n = 4, 25
	for _, grouped := range []bool{false, true} {
		name := "alone"
		if grouped {
			name = "group"
		}
		b.Run(name, func(b *testing.B) {
			e := newEnv(b)
			var g *inbox.Group
			var h inbox.Handler = pipeHandler{}
			if grouped {
				var err error
				if g, err = inbox.NewGroup(e.pool); err != nil {
					b.Fatal(err)
				}
				h = mergeHandler{calls: new(atomic.Int64)}
			}
			srcs := make([]inbox.Source, members)
			cs := make([]*inbox.Consumer, members)
			for i := range members {
				srcs[i] = e.source(b, "bench"+strconv.Itoa(i))
				var err error
				if cs[i], err = inbox.NewConsumer(e.pool, srcs[i], h, &inbox.Config{Logger: e.log, Group: g}); err != nil {
					b.Fatal(err)
				}
			}
			ctx := context.Background()
			jobs := make([]redisq.Job, n)
			ds := make([][]inbox.Delivery, members)
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				for i := range members {
					for j := range jobs {
						jobs[j] = job("bench")
					}
					e.add(b, jobs...)
					ds[i] = fetchAll(b, srcs[i], n)
				}
				b.StartTimer()
				var wg sync.WaitGroup
				for i, c := range cs {
					wg.Go(func() {
						if err := c.ProcessBatch(ctx, ds[i]); err != nil {
							b.Error(err)
						}
					})
				}
				wg.Wait()
			}
			b.StopTimer()
			txs := float64(members)
			if g != nil {
				txs = float64(g.Stats().Transactions) / float64(b.N)
			}
			b.ReportMetric(txs, "tx/op")
		})
	}
}
