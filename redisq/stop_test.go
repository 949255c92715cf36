package redisq_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/redisq"
)

// Stopping an inbox.Consumer on a redisq source in the documented order
// (Stop: fetching ends, the batch in flight commits and is acked) logs no
// warning: the trim an acknowledged batch left due is not attempted with
// the cancelled fetch context.
func TestStopLogsNoWarning(t *testing.T) {
	t.Parallel()
	q := newQueue(t, nil)
	var logs testenv.SyncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	// Block above TrimInterval: the fetch that Stop cuts short ends after
	// the trim is due, with the Ack's trim still pending.
	c := q.consumer(t, "w1", &redisq.ConsumerConfig{TrimInterval: 200 * time.Millisecond, Block: 400 * time.Millisecond, Logger: log})
	var applied atomic.Int64
	ic, err := inbox.NewConsumer(testenv.Pool(t), redisq.InboxSource(c),
		inbox.HandlerFunc(func(context.Context, pgx.Tx, inbox.Delivery) (bool, error) { return true, nil }),
		&inbox.Config{Logger: log, OnEvent: func(e inbox.Event) {
			if e.Kind == inbox.EventApplied {
				applied.Add(int64(e.N))
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := ic.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	q.add(t, 3, 0)
	testenv.WaitFor(t, 10*time.Second, "3 jobs applied", func() bool { return applied.Load() == 3 })
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ic.Stop(sctx); err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			t.Errorf("stop logged: %s", line)
		}
	}
}
