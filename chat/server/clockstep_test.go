package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/redisq"
)

// Postgres's wall clock is stepped back an hour (libfaketime in the real
// server) while three messages are lost in Redis (their stream deleted
// after the relay published them): the re-drive publishes them again after
// its usual wait, not an hour later; the receiver's socket shows 1..4 in
// order, each once; the next send takes the next seq, and every message
// ends ✓✓, once in the inbox, with nothing dead-lettered.
func TestPostgresClockStepBackDelaysNoRedrive(t *testing.T) {
	t.Parallel()
	pg := testenv.PrivateSteppedPostgres(t)
	h := newHarnessOn(t, pg.AdminURL(), "")
	fast := func(c *Config) { c.LockDuration = time.Second } // re-drive after 2 s
	cons := h.start(chat.Consumers, fast)
	work := h.start(chat.Workers, fast)
	const chatID = 17
	w := chattest.Watch(t, work.base, chatID)
	chattest.Send(t, cons.base, chatID, "before")
	w.WaitSeqs(t, chat.Consumers, 1, 10*time.Second)
	work.stop()
	for i := 1; i <= 3; i++ {
		chattest.Send(t, cons.base, chatID, fmt.Sprintf("lost %d", i))
	}
	testenv.WaitFor(t, 10*time.Second, "the relay to publish", func() bool {
		return h.Count(t, `SELECT count(*) FROM consumers.outbox WHERE sent_at IS NULL`) == 0
	})
	keys := redisq.NewKeys(h.Prefix, chat.QueueName(chat.Consumers))
	if err := testenv.Redis(t).Del(context.Background(), keys.Stream).Err(); err != nil {
		t.Fatal(err)
	}
	pg.Step(t, -time.Hour)

	work = h.start(chat.Workers, fast)
	w2 := chattest.Watch(t, work.base, chatID)
	// An hour's delay would time this out: the re-drive waits 2 s.
	w2.WaitSeqs(t, chat.Consumers, 4, 30*time.Second)
	if m := chattest.Send(t, cons.base, chatID, "after the step"); m.Seq != 5 {
		t.Fatalf("the send after the step got seq %d, want 5", m.Seq)
	}
	w2.WaitSeqs(t, chat.Consumers, 5, 10*time.Second)
	testenv.WaitFor(t, 20*time.Second, "every message ✓✓", func() bool {
		return h.Count(t, `SELECT count(*) FROM consumers.messages_with_receipts
			WHERE chat_id = $1 AND delivered_at IS NULL`, chatID) == 0
	})
	if n := h.Count(t, `SELECT count(*) FROM workers.inbox WHERE chat_id = $1`, chatID); n != 5 {
		t.Fatalf("workers.inbox has %d rows of chat %d, want 5", n, chatID)
	}
	if d := attackDeadLetters(t, h); d != 0 {
		t.Fatalf("%d dead letters, want none", d)
	}
}
