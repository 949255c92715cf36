package natsq_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/outboxchat/outboxchat/brokertest"
	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/internal/natsproc"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/natsq"
)

// startNATS starts a private nats-server with JetStream for the test and a
// natsq connection to it.
func startNATS(t *testing.T) (*natsproc.Server, *nats.Conn) {
	t.Helper()
	srv := testenv.PrivateNATS(t)
	nc, err := natsq.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return srv, nc
}

// newQueue makes sure of cfg's streams on nc (natsq.New), failing the
// test on error.
func newQueue(t *testing.T, nc *nats.Conn, cfg natsq.Config) *natsq.Queue {
	t.Helper()
	q, err := natsq.New(context.Background(), nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// newConsumer opens cfg's consumer on q (Queue.NewConsumer), failing the
// test on error.
func newConsumer(t *testing.T, q *natsq.Queue, cfg natsq.ConsumerConfig) *natsq.Consumer {
	t.Helper()
	c, err := q.NewConsumer(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestConformance runs the broker suite that redisq passes too, on a
// nats-server of its own (the suite stops and starts it).
func TestConformance(t *testing.T) {
	srv, nc := startNATS(t)
	var n atomic.Int64
	const lock = time.Second
	stop, start := brokertest.StopStart(srv, nc.IsConnected)
	brokertest.Run(t, brokertest.Broker{
		NewQueue: func(t *testing.T) brokertest.Queue {
			ctx := context.Background()
			q := newQueue(t, nc, natsq.Config{Queue: "conf" + strconv.FormatInt(n.Add(1), 10)})
			return brokertest.Queue{
				Publisher:    natsq.OutboxPublisher(q),
				LockDuration: lock,
				Source: func(t *testing.T, group, _ string) inbox.Source {
					c, err := q.NewConsumer(ctx, natsq.ConsumerConfig{Group: group, LockDuration: lock, FetchWait: 200 * time.Millisecond})
					if err != nil {
						t.Fatal(err)
					}
					return natsq.InboxSource(c)
				},
				DeadLetters: brokertest.DeadLettersOf(func(ctx context.Context) ([]natsq.DeadLetter, error) {
					return q.DeadLetters(ctx, 0, 100)
				}, func(d natsq.DeadLetter) brokertest.DeadLetter {
					return brokertest.DeadLetter{ID: d.ID, Reason: d.Reason}
				}),
			}
		},
		// The suite's Start gives back a broker to use: the client's own
		// reconnect (every 100 ms) is awaited.
		Stop: stop, Start: start,
	})
}
