package redisq_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/outbox"
	"github.com/outboxchat/outboxchat/redisq"
)

// Example_outboxToInbox wires the whole path: an outbox table in the
// sender's database, a relay publishing into a redisq stream, and an inbox
// consumer recording each event once in the receiver's table. Both sides
// must name the same Queue (and Prefix). It needs Postgres and Redis, so it
// is compiled but not run; in real services the two halves run in
// different processes.
func Example_outboxToInbox() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	rdb, err := redisq.NewClient(os.Getenv("REDIS_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer rdb.Close()
	const queue = "orders"

	// Sender: the outbox table (outbox.TableDDL("sender.outbox") in a
	// migration), a Writer for the business transactions, and the relay.
	pub, err := redisq.NewPublisher(rdb, &redisq.PublisherConfig{Queue: queue})
	if err != nil {
		log.Fatal(err)
	}
	relay, err := outbox.NewRelay(pool, &outbox.RelayConfig{Table: "sender.outbox", Publisher: redisq.OutboxPublisher(pub)})
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer relay.Stop(context.Background())

	// Receiver: a consumer-group member of the same queue, and an inbox
	// table keyed by the event's idempotency key:
	//   CREATE TABLE receiver.inbox (id text PRIMARY KEY, payload jsonb NOT NULL);
	q, err := redisq.NewConsumer(rdb, &redisq.ConsumerConfig{Queue: queue, Group: "receiver", Consumer: "receiver-1"})
	if err != nil {
		log.Fatal(err)
	}
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, d inbox.Delivery) (bool, error) {
		tag, err := tx.Exec(ctx, `INSERT INTO receiver.inbox (id, payload) VALUES ($1, $2::jsonb)
			ON CONFLICT (id) DO NOTHING`, d.ID, string(d.Payload))
		if err != nil {
			return false, err // a bad payload (22P02) is dead-lettered, a lost connection retried
		}
		return tag.RowsAffected() == 1, nil
	})
	c, err := inbox.NewConsumer(pool, redisq.InboxSource(q), h, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer c.Stop(context.Background())

	// ... serve; each event enqueued with Writer.Enqueue in a committed
	// transaction ends up as one receiver.inbox row.
	fmt.Printf("%+v\n", c.Stats())
}
