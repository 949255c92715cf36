package outboxtest_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/outbox"
	"github.com/outboxchat/outboxchat/outboxtest"
	"github.com/outboxchat/outboxchat/redisq"
)

// Example runs the library end to end on private servers: a sender commits
// an order and its outbox event in one transaction (outbox.Writer), the
// outbox.Relay publishes the event to a redisq stream, and the receiver's
// inbox.Consumer records it once in its inbox table, then acknowledges it.
//
// Both sides share one database and one process here to keep the example
// short; real services run them in different processes, each with its own
// schema. Both sides must name the same redisq Queue (and Prefix).
//
// Start order: the receiver may start before or after the sender (its
// consumer group reads the stream from the beginning). Stop order, the
// reverse of the data flow's start: stop taking requests; Writer.Stop (a
// lost wake-up only waits for the relay's poll); Relay.Stop (finishes the
// pass in flight: publish, mark sent); Consumer.Stop (finishes the batch in
// flight: commit, then ack); only then close the Redis client and the pool,
// which all three use until they have stopped.
//
// `make test` runs it (go test ./outboxtest); it is skipped, with the
// reason printed, when the PostgreSQL or Redis server binaries are missing.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := outboxtest.Start(ctx) // a private Postgres and Redis on free ports
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()

	pool, err := pgxpool.New(ctx, srv.DatabaseURL)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	rdb, err := redisq.NewClient(srv.RedisURL) // fail-fast settings: no offline buffering
	if err != nil {
		log.Fatal(err)
	}
	defer rdb.Close()
	quiet := slog.New(slog.DiscardHandler)

	// Migrations: the sender's business table and outbox, the receiver's
	// inbox keyed by the idempotency key.
	schema := `CREATE SCHEMA sender;
		CREATE TABLE sender.orders (id text PRIMARY KEY, total int NOT NULL);
		` + outbox.TableDDL("sender.outbox") + `
		CREATE SCHEMA receiver;
		CREATE TABLE receiver.inbox (id text PRIMARY KEY, payload jsonb NOT NULL,
			received_at timestamptz NOT NULL DEFAULT now());`
	if _, err := pool.Exec(ctx, schema); err != nil {
		log.Fatal(err)
	}
	const queue = "orders"

	// Receiver: a member of consumer group "receiver" on the queue, and a
	// Handler that records each delivery once by its ID.
	q, err := redisq.NewConsumer(rdb, &redisq.ConsumerConfig{
		Queue: queue, Group: "receiver", Consumer: "receiver-1", Block: 100 * time.Millisecond, Logger: quiet,
	})
	if err != nil {
		log.Fatal(err)
	}
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, d inbox.Delivery) (bool, error) {
		if d.ID == "" {
			return false, fmt.Errorf("delivery %s has no id: %w", d.Ref, inbox.ErrMalformed)
		}
		tag, err := tx.Exec(ctx, `INSERT INTO receiver.inbox (id, payload) VALUES ($1, $2::jsonb)
			ON CONFLICT (id) DO NOTHING`, d.ID, string(d.Payload))
		if err != nil {
			return false, err // a payload that is not JSON (22P02) is dead-lettered; a lost connection retried
		}
		return tag.RowsAffected() == 1, nil
	})
	consumer, err := inbox.NewConsumer(pool, redisq.InboxSource(q), h, &inbox.Config{Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	if err := consumer.Start(ctx); err != nil {
		log.Fatal(err)
	}

	// Sender: the Writer enqueues in the caller's transaction and wakes the
	// relay after commit; the Relay publishes through redisq, idempotently
	// by event ID.
	w, err := outbox.NewWriter(pool, &outbox.WriterConfig{Table: "sender.outbox", Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		log.Fatal(err)
	}
	pub, err := redisq.NewPublisher(rdb, &redisq.PublisherConfig{Queue: queue, Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	relay, err := outbox.NewRelay(pool, &outbox.RelayConfig{
		Table: "sender.outbox", Publisher: redisq.OutboxPublisher(pub), Logger: quiet,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Start(ctx); err != nil {
		log.Fatal(err)
	}

	// Two business transactions: each order and its event commit together
	// or not at all.
	for i, total := range []int{42, 7} {
		id := fmt.Sprintf("order-%d", i+1)
		// InTx commits, then wakes the relay (Writer.Committed).
		err := w.InTx(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO sender.orders (id, total) VALUES ($1, $2)`, id, total); err != nil {
				return err
			}
			return w.Enqueue(ctx, tx, outbox.Event{
				ID: id, Name: "order.created", Payload: fmt.Appendf(nil, `{"total": %d}`, total),
			})
		})
		if err != nil {
			log.Fatal(err)
		}
	}

	// Wait (with a deadline) until the receiver has recorded both.
	var n int
	for deadline := time.Now().Add(30 * time.Second); n < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			log.Fatalf("inbox has %d rows after 30 s", n)
		}
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM receiver.inbox`).Scan(&n); err != nil {
			log.Fatal(err)
		}
	}

	// Shutdown, in this order; the deferred Closes of rdb, pool and srv
	// run after.
	if err := w.Stop(ctx); err != nil {
		log.Fatal(err)
	}
	if err := relay.Stop(ctx); err != nil {
		log.Fatal(err)
	}
	if err := consumer.Stop(ctx); err != nil {
		log.Fatal(err)
	}

	rows, err := pool.Query(ctx, `SELECT id, payload::text FROM receiver.inbox ORDER BY id`)
	if err != nil {
		log.Fatal(err)
	}
	for rows.Next() {
		var id, payload string
		if err := rows.Scan(&id, &payload); err != nil {
			log.Fatal(err)
		}
		fmt.Println("receiver.inbox:", id, payload)
	}
	if err := rows.Err(); err != nil {
		log.Fatal(err)
	}
	var unsent int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM sender.outbox WHERE sent_at IS NULL`).Scan(&unsent); err != nil {
		log.Fatal(err)
	}
	fmt.Println("unsent in sender.outbox:", unsent)
	fmt.Printf("inbox consumer: %+v\n", consumer.Stats())
	// Output:
	// receiver.inbox: order-1 {"total": 42}
	// receiver.inbox: order-2 {"total": 7}
	// unsent in sender.outbox: 0
	// inbox consumer: {Applied:2 Duplicates:0 DeadLettered:0}
}
