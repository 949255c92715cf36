package server

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/internal/testenv"
)

// The gateway holds the other side's messages behind a missing seq for
// GapTimeout, then pushes them; the missing one is pushed when it finally
// comes (a reclaimed job), and nothing is pushed twice.
func TestGatewayGapHoldThenLateMessage(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	work := h.startAPI(chat.Workers, func(c *Config) { c.API.GapTimeout = 300 * time.Millisecond })
	w := chattest.Watch(t, work.base, 11)
	ctx := context.Background()
	recv := func(seq int64) {
		t.Helper()
		_, err := h.Admin.Exec(ctx, `WITH ins AS (INSERT INTO workers.inbox (message_id, chat_id, seq, body, sender, sent_at)
			VALUES ($1, 11, $2, 'm', 'consumers', now()) RETURNING chat_id) SELECT pg_notify('workers_inbox', chat_id::text) FROM ins`,
			uuid.NewString(), seq)
		if err != nil {
			t.Fatal(err)
		}
	}
	seqs := func() []int64 {
		var out []int64
		for _, m := range w.From(chat.Consumers) {
			out = append(out, m.Seq)
		}
		return out
	}
	recv(1)
	testenv.WaitFor(t, 5*time.Second, "seq 1", func() bool { return len(seqs()) == 1 })
	held := time.Now()
	recv(3)
	testenv.WaitFor(t, 5*time.Second, "seq 3 pushed after the hold", func() bool { return len(seqs()) == 2 })
	if waited := time.Since(held); waited < 250*time.Millisecond {
		t.Fatalf("seq 3 pushed after %v, want it held for the gap timeout", waited)
	}
	recv(2) // the late one
	testenv.WaitFor(t, 5*time.Second, "late seq 2", func() bool { return len(seqs()) == 3 })
	recv(4)
	testenv.WaitFor(t, 5*time.Second, "seq 4", func() bool { return len(seqs()) == 4 })
	got := seqs()
	want := []int64{1, 3, 2, 4}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("pushed seqs %v, want %v (each once)", got, want)
		}
	}
}
