package inbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/redisq"
)

// ExampleConsumer wires a Consumer between a redisq consumer group and an
// inbox table:
//
//	CREATE TABLE workers.inbox (
//	  message_id uuid PRIMARY KEY,  -- the idempotency key: one row per message
//	  chat_id    bigint NOT NULL,
//	  body       text NOT NULL,
//	  received_at timestamptz NOT NULL DEFAULT now());
//
// It needs running Postgres and Redis servers, so it is compiled but not
// run; outboxtest's Example runs the whole path (Writer, Relay, redisq, inbox)
// on private servers and checks its output.
func ExampleConsumer() {
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

	// Queue (and Prefix) must be those the sender's redisq.Publisher uses.
	q, err := redisq.NewConsumer(rdb, &redisq.ConsumerConfig{
		Queue: "consumers-to-workers", Group: "workers", Consumer: "worker-1",
	})
	if err != nil {
		log.Fatal(err)
	}

	// The Handler decodes before touching tx (ErrMalformed dead-letters),
	// then records the message once by its idempotency key, d.ID (the
	// outbox Event.ID the sender enqueued it with).
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, d inbox.Delivery) (bool, error) {
		var m struct {
			ChatID int64  `json:"chat_id"`
			Body   string `json:"body"`
		}
		if err := json.Unmarshal(d.Payload, &m); err != nil || d.ID == "" {
			return false, fmt.Errorf("decoding message %s: %w", d.ID, inbox.ErrMalformed)
		}
		tag, err := tx.Exec(ctx, `INSERT INTO workers.inbox (message_id, chat_id, body)
			VALUES ($1, $2, $3) ON CONFLICT (message_id) DO NOTHING`, d.ID, m.ChatID, m.Body)
		if err != nil {
			return false, fmt.Errorf("inserting inbox row: %w", err)
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
	// ... until shutdown:
	if err := c.Stop(ctx); err != nil {
		log.Print(err)
	}
	fmt.Printf("%+v\n", c.Stats())
}
