package outbox_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/outbox"
)

// notifyCounter is a pgx tracer that counts the statements that call
// pg_notify.
type notifyCounter struct{ n atomic.Int64 }

func (c *notifyCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "pg_notify") {
		c.n.Add(1)
	}
	return ctx
}

func (c *notifyCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Writers of two outbox tables that share a Notifier wake both channels
// with one statement: the first Committed after a quiet spell goes at
// once, and the Committed calls of both Writers within the interval become
// one statement at its end that notifies both channels.
func TestNotifierSharedByWriters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const interval = 300 * time.Millisecond
	pool := setup(t)
	if _, err := pool.Exec(ctx, outbox.TableDDL("ob.outbox_p1")); err != nil {
		t.Fatal(err)
	}
	counter := &notifyCounter{}
	cfg := pool.Config()
	cfg.ConnConfig.Tracer = counter
	npool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(npool.Close)
	n, err := outbox.NewNotifier(npool, &outbox.NotifierConfig{Interval: interval})
	if err != nil {
		t.Fatal(err)
	}
	w0, err := outbox.NewWriter(npool, &outbox.WriterConfig{Table: testTable, Notifier: n})
	if err != nil {
		t.Fatal(err)
	}
	w1, err := outbox.NewWriter(npool, &outbox.WriterConfig{Table: "ob.outbox_p1", Notifier: n})
	if err != nil {
		t.Fatal(err)
	}
	next := listen(t, pool, w0.Channel(), w1.Channel())
	// The Writers leave a shared Notifier to its owner.
	if err := w0.Start(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w0.Started():
		t.Fatal("a Writer started the Notifier it shares")
	default:
	}
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Stop(context.Background()) })
	<-w1.Started()

	start := time.Now()
	w0.Committed()
	if ch, ok := next(5 * time.Second); !ok || ch != w0.Channel() {
		t.Fatalf("first notification = %q (%v), want %q", ch, ok, w0.Channel())
	}
	if d := time.Since(start); d >= interval {
		t.Fatalf("first notification after %v: a quiet Notifier must notify at once", d)
	}
	for range 10 {
		w0.Committed()
		w1.Committed()
	}
	got := map[string]bool{}
	for range 2 {
		ch, ok := next(5 * time.Second)
		if !ok {
			t.Fatalf("notifications after the burst: %v, want both channels", got)
		}
		got[ch] = true
	}
	if !got[w0.Channel()] || !got[w1.Channel()] {
		t.Fatalf("notifications after the burst on %v, want %q and %q", got, w0.Channel(), w1.Channel())
	}
	if d := time.Since(start); d < interval-50*time.Millisecond {
		t.Fatalf("the burst's notifications came %v after the first Committed, want at least about %v", d, interval)
	}
	if ch, ok := next(2 * interval); ok {
		t.Fatalf("a further notification on %q: the burst must be one statement", ch)
	}
	if got := counter.n.Load(); got != 2 {
		t.Fatalf("notify statements = %d, want 2 (the first, then one for the burst on both channels)", got)
	}
}

func TestNewNotifierValidates(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	for name, cfg := range map[string]*outbox.NotifierConfig{
		"negative timeout":  {Timeout: -1},
		"negative interval": {Interval: -time.Millisecond},
	} {
		if _, err := outbox.NewNotifier(pool, cfg); !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Errorf("%s: NewNotifier = %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := outbox.NewNotifier(nil, nil); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Errorf("nil pool: NewNotifier = %v, want ErrInvalidConfig", err)
	}
}

// listen opens a connection of its own to pool's database that LISTENs on
// channels, and returns a function that waits up to d for the next
// notification and returns its channel (false when none came in time).
func listen(t *testing.T, pool *pgxpool.Pool, channels ...string) func(d time.Duration) (string, bool) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	for _, ch := range channels {
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			t.Fatal(err)
		}
	}
	return func(d time.Duration) (string, bool) {
		wctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		n, err := conn.WaitForNotification(wctx)
		if err != nil {
			return "", false
		}
		return n.Channel, true
	}
}
