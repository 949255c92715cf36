package outbox_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/outbox"
)

// Example shows the write side (enqueue in the caller's transaction, then
// Committed) and the relay. It needs a database, so it has no output check;
// outboxtest's Example runs the whole path (Writer, Relay, redisq, inbox) on
// private servers and checks its output.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	// In a migration: CREATE SCHEMA app; plus outbox.TableDDL("app.outbox").

	w, err := outbox.NewWriter(pool, &outbox.WriterConfig{Table: "app.outbox"})
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer w.Stop(context.Background())

	relay, err := outbox.NewRelay(pool, &outbox.RelayConfig{
		Table: "app.outbox",
		Publisher: outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) error {
			for _, m := range msgs {
				fmt.Println(m.ID, m.Event, string(m.Payload)) // a real Publisher adds to the broker, idempotently by m.ID
			}
			return nil
		}),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer relay.Stop(context.Background())

	// InTx commits and then wakes the relay (Writer.Committed); with a
	// transaction of your own, call w.Committed() after its commit.
	err = w.InTx(ctx, pool, func(tx pgx.Tx) error {
		// ... the business write, e.g. INSERT INTO app.messages ...
		return w.Enqueue(ctx, tx, outbox.Event{
			ID:      "0b5f6c1e-9d1c-4c8e-9a51-3f0f7f8f2a10",
			Name:    "message.created",
			Payload: []byte(`{"chat_id": 1, "seq": 1, "body": "hi"}`),
		})
	})
	if err != nil {
		log.Fatal(err)
	}
	<-ctx.Done()
}
