package server

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/chat/store"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/redisq"
)

// attackDeadLetters is the number of dead letters on both services' queues.
func attackDeadLetters(t *testing.T, h *harness) int64 {
	t.Helper()
	rdb, err := redisq.NewClient(h.RedisURL)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	var n int64
	for _, s := range []string{chat.Consumers, chat.Workers} {
		qi, err := redisq.Inspect(context.Background(), rdb, h.Prefix, chat.QueueName(s))
		if err != nil {
			t.Fatal(err)
		}
		n += int64(qi.DeadLetters)
	}
	return n
}

// attackSettled waits for chat's receipts on consumers to reach n and the
// workers' socket w to hold exactly 1..n of consumers' messages; then
// checks nothing was marked delivered before it was sent and nothing was
// dead-lettered.
func attackSettled(t *testing.T, h *harness, w *chattest.Watcher, chatID int64, n int) {
	t.Helper()
	w.WaitSeqs(t, chat.Consumers, n, 30*time.Second)
	testenv.WaitFor(t, 30*time.Second, fmt.Sprintf("chat %d: receipt up to %d", chatID, n), func() bool {
		return h.Count(t, `SELECT coalesce(max(upto_seq), 0) FROM consumers.receipts WHERE chat_id = $1`, chatID) == n
	})
	if got := h.Count(t, `SELECT coalesce(max(upto_seq), 0) FROM consumers.receipts WHERE chat_id = $1`, chatID); got != n {
		t.Fatalf("chat %d: receipt %d, want %d", chatID, got, n)
	}
	if c := h.Count(t, `SELECT count(*) FROM consumers.messages_with_receipts WHERE chat_id = $1 AND delivered_at < created_at`, chatID); c != 0 {
		t.Fatalf("chat %d: %d messages marked delivered before they were sent", chatID, c)
	}
	if d := attackDeadLetters(t, h); d != 0 {
		t.Fatalf("%d dead letters, want none", d)
	}
	w.WaitSeqs(t, chat.Consumers, n, time.Second) // still exactly 1..n, once each
}

// Attack (a)/(b)/(c): prunes with an --older-than covering every row, two
// at a time on each service, and hand deletes on both sides (middle rows of
// the receiver, covered rows of the sender, TRUNCATE of the receiver's
// inbox) run while a chat is being sent to, with a socket of the receiver
// open throughout: every send gets the next seq, the socket shows 1..n
// once each in order, receipts reach n, nothing is dead-lettered.
func TestAttackPruneAndDeletesWhileSending(t *testing.T) {
	t.Parallel()
	h, cons, work := startBoth(t)
	const chatID, n = 71, 30
	w := chattest.Watch(t, work.base, chatID)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	loop := func(f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if err := f(); err != nil && ctx.Err() == nil {
					errs <- err
					return
				}
			}
		}()
	}
	for range 2 {
		for _, s := range []string{chat.Consumers, chat.Workers} {
			loop(func() error {
				_, err := store.Prune(ctx, h.Admin, store.PruneConfig{Service: s, OlderThan: time.Nanosecond, Batch: 2})
				return err
			})
		}
	}
	hand := []string{
		`DELETE FROM workers.inbox WHERE chat_id = 71 AND seq % 2 = 0`,
		`DELETE FROM consumers.messages WHERE chat_id = 71 AND seq % 3 = 0
			AND seq <= (SELECT coalesce(max(upto_seq), 0) FROM consumers.receipts WHERE chat_id = 71)`,
		`TRUNCATE workers.inbox`,
		`DELETE FROM consumers.receipts WHERE chat_id = 71 AND upto_seq < (SELECT max(upto_seq) FROM consumers.receipts WHERE chat_id = 71)`,
	}
	i := 0
	loop(func() error {
		i++
		_, err := h.Admin.Exec(ctx, hand[i%len(hand)])
		return err
	})
	for i := 1; i <= n; i++ {
		if m := chattest.Send(t, cons.base, chatID, fmt.Sprint("m ", i)); m.Seq != int64(i) {
			t.Fatalf("message %d got seq %d", i, m.Seq)
		}
	}
	w.WaitSeqs(t, chat.Consumers, n, 30*time.Second)
	cancel()
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	attackSettled(t, h, w, chatID, n)
	// The chat goes on after all that.
	if m := chattest.Send(t, cons.base, chatID, "after"); m.Seq != n+1 {
		t.Fatalf("after the deletes: seq %d, want %d", m.Seq, n+1)
	}
	attackSettled(t, h, w, chatID, n+1)
}

// Attack (a)/(c): the newest message is deleted by hand right after it
// was sent, while its outbox row is still pending (no relay is running
// yet): the next send still gets the next seq, and once a relay runs,
// both reach the receiver's socket in order and receipts cover them.
func TestAttackDeleteNewestBeforeRelay(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	cons := h.startAPI(chat.Consumers, nil)
	work := h.start(chat.Workers, nil)
	const chatID = 72
	w := chattest.Watch(t, work.base, chatID)
	for i := 1; i <= 3; i++ {
		chattest.Send(t, cons.base, chatID, fmt.Sprint("m ", i))
	}
	if p := h.Count(t, `SELECT count(*) FROM consumers.outbox`); p != 3 {
		t.Fatalf("%d outbox rows pending, want 3", p)
	}
	if _, err := h.Admin.Exec(context.Background(), `DELETE FROM consumers.messages WHERE chat_id = $1 AND seq = 3`, chatID); err != nil {
		t.Fatal(err)
	}
	if m := chattest.Send(t, cons.base, chatID, "m 4"); m.Seq != 4 {
		t.Fatalf("after deleting pending seq 3: seq %d, want 4", m.Seq)
	}
	h.start(chat.Consumers, func(c *Config) { c.Roles = []string{RoleRelay, RoleWorker} })
	attackSettled(t, h, w, chatID, 4)
}
