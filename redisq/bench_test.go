package redisq_test

import (
	"context"
	"strconv"
	"testing"

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
