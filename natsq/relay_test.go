package natsq_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/natsq"
	"github.com/outboxchat/outboxchat/outbox"
	"github.com/outboxchat/outboxchat/outboxtest"
)

// The library end to end on NATS: a Writer's events, committed with their
// business rows, reach the receiver's inbox once each through the outbox
// relay and natsq, across a nats-server that is down for a stretch of the
// sends (the relay keeps the rows in the outbox and publishes them when it
// is back; nothing waits in a client buffer).
func TestRelayToInboxAcrossNATSOutage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := outboxtest.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	pool, err := pgxpool.New(ctx, srv.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ns, nc := startNATS(t)
	quiet := slog.New(slog.DiscardHandler)
	if _, err := pool.Exec(ctx, `CREATE SCHEMA s; `+outbox.TableDDL("s.outbox")+`
		CREATE TABLE s.inbox (id text PRIMARY KEY, payload jsonb NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	q := newQueue(t, nc, natsq.Config{Queue: "orders"})
	c := newConsumer(t, q, natsq.ConsumerConfig{Group: "receiver", LockDuration: 5 * time.Second, FetchWait: 200 * time.Millisecond})
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, d inbox.Delivery) (bool, error) {
		tag, err := tx.Exec(ctx, `INSERT INTO s.inbox (id, payload) VALUES ($1, $2::jsonb) ON CONFLICT (id) DO NOTHING`, d.ID, string(d.Payload))
		return err == nil && tag.RowsAffected() == 1, err
	})
	consumer, err := inbox.NewConsumer(pool, natsq.InboxSource(c), h, &inbox.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := consumer.Start(ctx); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.NewWriter(pool, &outbox.WriterConfig{Table: "s.outbox", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	relay, err := outbox.NewRelay(pool, &outbox.RelayConfig{Table: "s.outbox", Publisher: natsq.OutboxPublisher(q),
		PollInterval: 200 * time.Millisecond, PublishTimeout: time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := relay.Start(ctx); err != nil {
		t.Fatal(err)
	}
	send := func(from, to int) {
		for i := from; i < to; i++ {
			err := w.InTx(ctx, pool, func(tx pgx.Tx) error {
				return w.Enqueue(ctx, tx, outbox.Event{ID: fmt.Sprintf("o%03d", i), Name: "order.created", Payload: fmt.Appendf(nil, `{"n": %d}`, i)})
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	count := func(sql string) int {
		var n int
		if err := pool.QueryRow(ctx, sql).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !cond(); {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s (inbox %d, outbox %d)", what, count(`SELECT count(*) FROM s.inbox`), count(`SELECT count(*) FROM s.outbox`))
			}
			select {
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	send(0, 20)
	waitFor("the first 20 in the inbox", func() bool { return count(`SELECT count(*) FROM s.inbox`) == 20 })
	if err := ns.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	send(20, 40) // committed while the broker is away: they wait in the outbox
	if n := count(`SELECT count(*) FROM s.outbox`); n != 20 {
		t.Fatalf("outbox holds %d rows with the broker down, want the 20 sent meanwhile", n)
	}
	if err := ns.Start(ctx); err != nil {
		t.Fatal(err)
	}
	send(40, 50)
	waitFor("all 50 in the inbox and the outbox empty", func() bool {
		return count(`SELECT count(*) FROM s.inbox`) == 50 && count(`SELECT count(*) FROM s.outbox`) == 0
	})
	for _, stop := range []func(context.Context) error{w.Stop, relay.Stop, consumer.Stop} {
		if err := stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if st := consumer.Stats(); st.Applied != 50 || st.DeadLettered != 0 {
		t.Fatalf("inbox consumer %+v: want 50 applied, none dead-lettered", st)
	}
}
