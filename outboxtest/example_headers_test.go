package outboxtest_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/outbox"
	"github.com/outboxchat/outboxchat/outboxtest"
	"github.com/outboxchat/outboxchat/redisq"
)

// Example_headers carries event headers (a trace context, a tenant) from
// the sender's transaction to the receiver's Handler: outbox.Event.Headers
// is stored with the row, the relay hands it to redisq (a "headers" field
// of the stream entry, signed with the rest when PublisherConfig.Sign is
// set) and the inbox gives it to the Handler as inbox.Delivery.Headers.
// Headers beyond the limits (outbox.MaxHeaders, MaxHeaderKeyBytes,
// MaxHeaderValueBytes) are refused by Enqueue with ErrInvalidHeaders,
// before anything is sent.
func Example_headers() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := outboxtest.Start(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	pool, err := pgxpool.New(ctx, srv.DatabaseURL)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	rdb, err := redisq.NewClient(srv.RedisURL)
	if err != nil {
		log.Fatal(err)
	}
	defer rdb.Close()
	quiet := slog.New(slog.DiscardHandler)
	// A table made by an earlier outbox.TableDDL gets the column with
	// outbox.HeadersDDL in a migration.
	if _, err := pool.Exec(ctx, "CREATE SCHEMA app;\n"+outbox.TableDDL("app.outbox")); err != nil {
		log.Fatal(err)
	}

	got := make(chan inbox.Delivery, 1)
	q, err := redisq.NewConsumer(rdb, &redisq.ConsumerConfig{
		Queue: "orders", Group: "receiver", Consumer: "receiver-1", Block: 100 * time.Millisecond, Logger: quiet,
	})
	if err != nil {
		log.Fatal(err)
	}
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, d inbox.Delivery) (bool, error) {
		got <- d // a real Handler records d in its inbox table, keyed by d.ID
		return true, nil
	})
	consumer, err := inbox.NewConsumer(pool, redisq.InboxSource(q), h, &inbox.Config{Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	if err := consumer.Start(ctx); err != nil {
		log.Fatal(err)
	}
	w, err := outbox.NewWriter(pool, &outbox.WriterConfig{Table: "app.outbox", Mode: outbox.WakeNone, Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	pub, err := redisq.NewPublisher(rdb, &redisq.PublisherConfig{Queue: "orders", Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	relay, err := outbox.NewRelay(pool, &outbox.RelayConfig{Table: "app.outbox", Publisher: redisq.OutboxPublisher(pub), Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		tooBig := outbox.Event{ID: "x", Name: "order.created", Payload: []byte(`{}`),
			Headers: map[string]string{"not a key": "v"}}
		fmt.Println("over the limits:", w.Enqueue(ctx, tx, tooBig) != nil)
		return w.Enqueue(ctx, tx, outbox.Event{
			ID: "order-1", Name: "order.created", Payload: []byte(`{"total": 42}`),
			Headers: map[string]string{
				"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
				"tenant":      "acme",
			},
		})
	})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := relay.RunOnce(ctx); err != nil { // what the started Relay does when woken
		log.Fatal(err)
	}
	d := <-got
	if err := consumer.Stop(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("received:", d.ID, string(d.Payload))
	for _, k := range slices.Sorted(maps.Keys(d.Headers)) {
		fmt.Printf("header %s: %s\n", k, d.Headers[k])
	}
	// Output:
	// over the limits: true
	// received: order-1 {"total": 42}
	// header tenant: acme
	// header traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01
}
