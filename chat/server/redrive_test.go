package server

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/redisq"
)

// End to end: the stream is lost (deleted with its group) after the relay
// published, while the dedupe marks stay; the re-drive publishes the
// messages again, the receiver shows each once, and receipts stop it.
func TestRedriveHealsALostStream(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	fast := func(c *Config) { c.LockDuration = time.Second } // re-drive after 2 s
	cons := h.start(chat.Consumers, fast)
	work := h.start(chat.Workers, fast)
	publishUnread(t, h, cons, work, `SELECT count(*) FROM consumers.outbox WHERE sent_at IS NULL`)
	rdb := testenv.Redis(t)
	keys := redisq.NewKeys(h.Prefix, chat.QueueName(chat.Consumers))
	if err := rdb.Del(context.Background(), keys.Stream).Err(); err != nil {
		t.Fatal(err)
	}
	work = h.start(chat.Workers, fast)
	redriveHealed(t, h, cons, work, 4, 20*time.Second)
}

// publishUnread sends "before" from cons to chat 9 and waits for work's
// client to show it, stops work, then sends "lost 1" to "lost 3" and waits
// until unsent (a count of consumers' outbox rows the relay has yet to
// publish) is 0: the 3 are in a queue nobody reads, for the caller to lose.
func publishUnread(t *testing.T, h *harness, cons, work *running, unsent string) {
	t.Helper()
	w := chattest.Watch(t, work.base, 9)
	chattest.Send(t, cons.base, 9, "before")
	w.WaitSeqs(t, chat.Consumers, 1, 10*time.Second)
	work.stop()
	for i := 1; i <= 3; i++ {
		chattest.Send(t, cons.base, 9, fmt.Sprintf("lost %d", i))
	}
	testenv.WaitFor(t, 10*time.Second, "the relay to publish", func() bool { return h.Count(t, unsent) == 0 })
}

// redriveHealed waits, each wait at most within, until workers' client of
// chat 9 shows consumers' seqs 1 to n and each of them has its receipt,
// and fails t unless the inbox holds each once and consumers counts at
// least 3 re-driven: the end of a scenario whose last 3 messages were lost
// from the queue.
func redriveHealed(t *testing.T, h *harness, cons, work *running, n int, within time.Duration) {
	t.Helper()
	w := chattest.Watch(t, work.base, 9)
	w.WaitSeqs(t, chat.Consumers, n, within)
	testenv.WaitFor(t, within, "every message delivered", func() bool {
		return h.Count(t, `SELECT count(*) FROM consumers.messages_with_receipts WHERE chat_id = 9 AND delivered_at IS NULL`) == 0
	})
	if got := h.Count(t, `SELECT count(*) FROM workers.inbox WHERE chat_id = 9`); got != n {
		t.Fatalf("workers.inbox has %d rows, want %d", got, n)
	}
	redrivenAtLeast(t, cons.base, 3)
}

// redrivenAtLeast fails t unless base's /metrics counts at least n
// re-driven messages (outboxchat_redriven_total).
func redrivenAtLeast(t *testing.T, base string, n int) {
	t.Helper()
	m, err := chattest.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	got := regexp.MustCompile(`outboxchat_redriven_total (\d+)`).FindStringSubmatch(m)
	if got == nil {
		t.Fatal("no outboxchat_redriven_total on /metrics")
	}
	if k, _ := strconv.Atoi(got[1]); k < n {
		t.Fatalf("outboxchat_redriven_total %d, want at least %d", k, n)
	}
}
