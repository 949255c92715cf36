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
				DeadLetters: func(t *testing.T) []brokertest.DeadLetter {
					l, err := dls.List(context.Background(), "", 100)
					if err != nil {
						t.Fatal(err)
					}
					out := make([]brokertest.DeadLetter, len(l))
					for i, d := range l {
						out[i] = brokertest.DeadLetter{ID: d.ID, Reason: d.Reason}
					}
					return out
				},
			}
		},
		Stop: func(t *testing.T) {
			if err := srv.Stop(context.Background()); err != nil {
				t.Fatal(err)
			}
		},
		Start: func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := srv.Start(ctx); err != nil {
				t.Fatal(err)
			}
		},
	})
}
