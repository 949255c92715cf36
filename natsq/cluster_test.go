package natsq_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/internal/natsproc"
	"github.com/outboxchat/outboxchat/natsq"
)

// Two processes making sure of the same queue at once on a three-node
// cluster (the two services at their starts) both get it, with three
// replicas: a create the cluster leaves unanswered is asked again.
func TestConcurrentNewOnACluster(t *testing.T) {
	if err := natsproc.Available(); err != nil {
		t.Fatalf("%v (scripts/install-deps.sh --test installs nats-server)", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := natsproc.StartCluster(ctx, 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			nc, err := natsq.Connect(c.URL())
			if err != nil {
				t.Error(err)
				return
			}
			defer nc.Close()
			for _, name := range []string{"a", "b"} {
				nctx, cancel := context.WithTimeout(ctx, 15*time.Second)
				q, err := natsq.New(nctx, nc, natsq.Config{Queue: name, Replicas: 3})
				if err == nil {
					_, err = q.NewConsumer(nctx, natsq.ConsumerConfig{Group: "g"})
				}
				cancel()
				if err != nil {
					t.Errorf("process %d, queue %s: %v", i, name, err)
				}
			}
		})
	}
	wg.Wait()
}
