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

// TestConformance runs the broker suite that redisq passes too, on a
// nats-server of its own (the suite stops and starts it).
func TestConformance(t *testing.T) {
	srv, nc := startNATS(t)
	var n atomic.Int64
	const lock = time.Second
	brokertest.Run(t, brokertest.Broker{
		NewQueue: func(t *testing.T) brokertest.Queue {
			ctx := context.Background()
			q, err := natsq.New(ctx, nc, natsq.Config{Queue: "conf" + strconv.FormatInt(n.Add(1), 10)})
			if err != nil {
				t.Fatal(err)
			}
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
				DeadLetters: func(t *testing.T) []brokertest.DeadLetter {
					l, err := q.DeadLetters(ctx, 0, 100)
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
			// The suite's Start gives back a broker to use: the client's
			// own reconnect (every 100 ms) is awaited.
			for !nc.IsConnected() {
				select {
				case <-ctx.Done():
					t.Fatalf("no reconnect to the restarted server: %v", nc.Status())
				case <-time.After(10 * time.Millisecond):
				}
			}
		},
	})
}
