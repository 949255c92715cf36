package redisq_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/internal/redisproc"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/redisq"
)

func benchPublisher(b *testing.B) (*redisq.Publisher, string) {
	b.Helper()
	rdb := testenv.Redis(b)
	prefix := testenv.Prefix(b)
	pub, err := redisq.NewPublisher(rdb, &redisq.PublisherConfig{Queue: "bench", Prefix: prefix})
	if err != nil {
		b.Fatal(err)
	}
	return pub, prefix
}

func BenchmarkAdd(b *testing.B) {
	pub, _ := benchPublisher(b)
	ctx := context.Background()
	payload := make([]byte, 200)
	i := 0
	for b.Loop() {
		i++
		if _, err := pub.Add(ctx, redisq.Job{ID: strconv.Itoa(i), Name: "message.created", Payload: payload}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAddBulk100(b *testing.B) {
	pub, _ := benchPublisher(b)
	addBatches(b, pub)
}

// addBatches is the loop of a benchmark adding batches of 100 new jobs
// (200-byte payloads) through pub; it reports jobs/s.
func addBatches(b *testing.B, pub *redisq.Publisher) {
	ctx := context.Background()
	payload := make([]byte, 200)
	js := make([]redisq.Job, 100)
	i := 0
	for b.Loop() {
		for k := range js {
			i++
			js[k] = redisq.Job{ID: strconv.Itoa(i), Name: "message.created", Payload: payload}
		}
		if _, err := pub.Add(ctx, js...); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*100)/b.Elapsed().Seconds(), "jobs/s")
}

func BenchmarkFetchAck100(b *testing.B) {
	pub, prefix := benchPublisher(b)
	ctx := context.Background()
	cons, err := redisq.NewConsumer(testenv.Redis(b), &redisq.ConsumerConfig{
		Queue: "bench", Prefix: prefix, Group: "g", Consumer: "c",
	})
	if err != nil {
		b.Fatal(err)
	}
	payload := make([]byte, 200)
	js := make([]redisq.Job, 100)
	i := 0
	for b.Loop() {
		b.StopTimer()
		for k := range js {
			i++
			js[k] = redisq.Job{ID: strconv.Itoa(i), Name: "message.created", Payload: payload}
		}
		if _, err := pub.Add(ctx, js...); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		got := 0
		for got < len(js) {
			ds, err := cons.Fetch(ctx, len(js)-got)
			if err != nil {
				b.Fatal(err)
			}
			ids := make([]string, len(ds))
			for k, d := range ds {
				ids[k] = d.StreamID
			}
			if err := cons.Ack(ctx, ids...); err != nil {
				b.Fatal(err)
			}
			got += len(ds)
		}
	}
	b.ReportMetric(float64(b.N*100)/b.Elapsed().Seconds(), "jobs/s")
}

// BenchmarkAddReplicaAcks adds batches of 100 jobs to a master with one
// replica (both private servers, AOF everysec), without and with waiting
// for the replica's acknowledgement (PublisherConfig.ReplicaAcks 1): the
// wait's cost per call.
func BenchmarkAddReplicaAcks(b *testing.B) {
	master := testenv.PrivateRedis(b)
	ctx := context.Background()
	replica, err := redisproc.Start(ctx, &redisproc.Options{ReplicaOf: master.Addr()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = replica.Close() })
	rdb, err := redisq.NewClient(master.URL())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = rdb.Close() })
	for _, acks := range []int{0, 1} {
		b.Run("acks="+strconv.Itoa(acks), func(b *testing.B) {
			pub, err := redisq.NewPublisher(rdb, &redisq.PublisherConfig{Queue: "bench" + strconv.Itoa(acks), ReplicaAcks: acks})
			if err != nil {
				b.Fatal(err)
			}
			// The replica counts once its master has it online.
			for start := time.Now(); time.Since(start) < 30*time.Second; {
				if _, err := pub.Add(ctx, redisq.Job{ID: "warm", Name: "warm"}); err == nil {
					break
				} else if !errors.Is(err, redisq.ErrNotReplicated) {
					b.Fatal(err)
				}
			}
			addBatches(b, pub)
		})
	}
}
