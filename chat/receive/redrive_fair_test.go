package receive

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/redisq"
)

// recordingRepublisher records the jobs a Redriver publishes.
type recordingRepublisher struct {
	mu   sync.Mutex
	jobs []redisq.Job
}

func (r *recordingRepublisher) Readd(_ context.Context, jobs ...redisq.Job) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.jobs = append(r.jobs, jobs...)
	return len(jobs), nil
}

// A chat that never gets a receipt (its receiver dead-letters one of its
// messages, so every later one is held and its receipt stays below them)
// must not keep the re-drive from the chats after it. Here chat 1 has 40
// such messages and chat 2 one message whose stream entry was lost;
// MaxPerPass 2, MaxBackoff 16 s, a pass per simulated second: once chat
// 1's first messages are due again (8 s after their first re-drive) it has
// two or more due at every pass. A full pass used to start the next one
// with the chat it stopped in, so every pass was chat 1's and chat 2's
// message was never published again: lost for good, though the doc
// promises it within ceil(chats / ChatsPerPass) × Interval of being due.
// In production: MaxPerPass 100, MaxBackoff 16 × After and Interval
// After/4 give this with 6,400 undelivered messages in one chat.
func TestRedriveReachesTheChatsBehindAStuckOne(t *testing.T) {
	t.Parallel()
	h := chattest.New(t, "")
	ctx := context.Background()
	pool := h.RolePool(t, chat.Consumers)
	_, err := pool.Exec(ctx, `INSERT INTO consumers.messages (chat_id, seq, body, created_at)
		SELECT 1, s, 'x', now() - interval '10 seconds' FROM generate_series(1, 40) s;
		INSERT INTO consumers.messages (chat_id, seq, body, created_at) VALUES (2, 1, 'lost', now() - interval '10 seconds')`)
	if err != nil {
		t.Fatal(err)
	}
	pub := &recordingRepublisher{}
	rd, err := NewRedriver(pool, chat.Consumers, pub, &RedriveConfig{After: 4 * time.Second, Interval: time.Second, MaxPerPass: 2, MaxBackoff: 16 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for pass := 1; pass <= 60; pass++ {
		if _, err := rd.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		for _, j := range pub.jobs {
			m, err := chat.DecodeEvent(j.Payload)
			if err != nil {
				t.Fatal(err)
			}
			if m.ChatID == 2 {
				t.Logf("chat 2's message re-driven at pass %d", pass)
				return
			}
		}
		// One Interval passes: every timestamp the re-drive compares
		// with now() moves a second into the past.
		if _, err := pool.Exec(ctx, `UPDATE consumers.messages SET created_at = created_at - interval '1 second',
			redriven_at = redriven_at - interval '1 second'`); err != nil {
			t.Fatal(err)
		}
	}
	t.Fatalf("chat 2's lost message was not re-driven in 60 passes (60 s of Interval 1 s): %d re-drives, all of chat 1", len(pub.jobs))
}
