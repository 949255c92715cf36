package redisq_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/brokertest"
	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/internal/redisproc"
	"github.com/outboxchat/outboxchat/redisq"
)

// TestConformance runs the broker suite that natsq passes too, on a Redis
// of its own (the suite stops and starts it).
func TestConformance(t *testing.T) {
	ctx := context.Background()
	srv, err := redisproc.Start(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	rdb, err := redisq.NewClient(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	var n atomic.Int64
	const lock = time.Second
	stop, start := brokertest.StopStart(srv, nil)
	brokertest.Run(t, brokertest.Broker{
		NewQueue: func(t *testing.T) brokertest.Queue {
			queue := "conf" + strconv.FormatInt(n.Add(1), 10)
			pub, err := redisq.NewPublisher(rdb, &redisq.PublisherConfig{Queue: queue})
			if err != nil {
				t.Fatal(err)
			}
			dls, err := redisq.NewDeadLetters(rdb, "", queue, 0, nil)
			if err != nil {
				t.Fatal(err)
			}
			return brokertest.Queue{
				Publisher:    redisq.OutboxPublisher(pub),
				LockDuration: lock,
				Source: func(t *testing.T, group, consumer string) inbox.Source {
					c, err := redisq.NewConsumer(rdb, &redisq.ConsumerConfig{Queue: queue, Group: group, Consumer: consumer,
						Block: 200 * time.Millisecond, LockDuration: lock})
					if err != nil {
						t.Fatal(err)
					}
					return redisq.InboxSource(c)
				},
				DeadLetters: brokertest.DeadLettersOf(func(ctx context.Context) ([]redisq.DeadLetter, error) {
					return dls.List(ctx, "", 100)
				}, func(d redisq.DeadLetter) brokertest.DeadLetter {
					return brokertest.DeadLetter{ID: d.ID, Reason: d.Reason}
				}),
			}
		},
		Stop: stop, Start: start,
	})
}
