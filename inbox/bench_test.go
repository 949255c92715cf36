package inbox_test

import (
	"context"
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
