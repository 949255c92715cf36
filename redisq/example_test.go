package redisq_test

import (
	"context"
	"log"
	"time"

	"github.com/outboxchat/outboxchat/redisq"
)

// Example shows a publisher and a consumer of one queue. It needs a Redis
// server, so it only compiles as a test.
func Example() {
	ctx := context.Background()
	rdb, err := redisq.NewClient("redis://127.0.0.1:6379/0")
	if err != nil {
		log.Fatal(err)
	}
	defer rdb.Close()
	_ = redisq.CheckDurability(ctx, rdb, nil) // logs a warning if jobs could be lost

	pub, err := redisq.NewPublisher(rdb, &redisq.PublisherConfig{Queue: "chat"})
	if err != nil {
		log.Fatal(err)
	}
	// Adding the same id twice adds it once; both calls succeed.
	job := redisq.Job{ID: "0b6c…", Name: "message.created", Payload: []byte(`{"body":"hi"}`)}
	if _, err := pub.Add(ctx, job, job); err != nil {
		log.Fatal(err) // retry the whole call: adds are idempotent
	}

	cons, err := redisq.NewConsumer(rdb, &redisq.ConsumerConfig{
		Queue: "chat", Group: "workers", Consumer: "worker-1", LockDuration: 5 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	ds, err := cons.Fetch(ctx, 100)
	if err != nil {
		log.Fatal(err)
	}
	for _, d := range ds {
		if d.Err != nil {
			_ = cons.DeadLetter(ctx, d, d.Err.Error())
			continue
		}
		// ... process d.Payload durably, then:
		_ = cons.Ack(ctx, d.StreamID)
	}
}
