package server

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/redisq"
)

// An operator deletes a quiet chat's history by hand on the sender, the
// receiver or both, with the sender's receipts deleted too or kept, while
// a WebSocket client of the receiver stays open at the chat's last seq:
// the next messages get the next seqs, reach that client, and are marked
// delivered by receipts that cover them and nothing else; nothing is
// dead-lettered.
func TestHandDeletedHistoryKeepsChatsFlowing(t *testing.T) {
	t.Parallel()
	h, cons, work := startBoth(t)
	ctx := context.Background()
	cases := []struct {
		chat                    int64
		sender, receipts, inbox bool
	}{
		{21, true, true, false},
		{22, true, false, false},
		{23, false, false, true},
		{24, true, true, true},
		{25, true, false, true},
	}
	watchers := map[int64]*chattest.Watcher{}
	delivered := func(chatID int64) int {
		return h.Count(t, `SELECT coalesce(max(upto_seq), 0) FROM consumers.receipts WHERE chat_id = $1`, chatID)
	}
	for _, c := range cases {
		w := chattest.Watch(t, work.base, c.chat)
		watchers[c.chat] = w
		for i := 1; i <= 3; i++ {
			chattest.Send(t, cons.base, c.chat, fmt.Sprint("before ", i))
		}
		w.WaitSeqs(t, chat.Consumers, 3, 20*time.Second)
		testenv.WaitFor(t, 20*time.Second, "receipt up to 3", func() bool { return delivered(c.chat) == 3 })
	}
	for _, c := range cases {
		for _, del := range []struct {
			on  bool
			sql string
		}{
			{c.sender, `DELETE FROM consumers.messages WHERE chat_id = $1`},
			{c.receipts, `DELETE FROM consumers.receipts WHERE chat_id = $1`},
			{c.inbox, `DELETE FROM workers.inbox WHERE chat_id = $1`},
		} {
			if del.on {
				if _, err := h.Admin.Exec(ctx, del.sql, c.chat); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	for _, c := range cases {
		name := fmt.Sprintf("chat %d (sender %v, receipts %v, inbox %v)", c.chat, c.sender, c.receipts, c.inbox)
		for i := 4; i <= 5; i++ {
			m := chattest.Send(t, cons.base, c.chat, fmt.Sprint("after ", i))
			if m.Seq != int64(i) {
				t.Fatalf("%s: new message got seq %d, want %d", name, m.Seq, i)
			}
		}
		watchers[c.chat].WaitSeqs(t, chat.Consumers, 5, 20*time.Second)
		testenv.WaitFor(t, 20*time.Second, name+": receipt up to 5", func() bool { return delivered(c.chat) == 5 })
		if n := h.Count(t, `SELECT count(*) FROM consumers.messages_with_receipts
			WHERE chat_id = $1 AND delivered_at < created_at`, c.chat); n != 0 {
			t.Fatalf("%s: %d messages marked delivered before they were sent", name, n)
		}
	}
	rdb, err := redisq.NewClient(h.RedisURL)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	qi, err := redisq.Inspect(ctx, rdb, h.Prefix, chat.QueueName(chat.Consumers))
	if err != nil {
		t.Fatal(err)
	}
	dead := qi.DeadLetters
	if dead != 0 {
		t.Fatalf("%d dead letters, want none", dead)
	}

	// A message at a seq the receiver already holds, under another id (a
	// sender that lost its rows and floors): dead-lettered and counted.
	pub, err := redisq.NewPublisher(rdb, &redisq.PublisherConfig{Queue: chat.QueueName(chat.Consumers), Prefix: h.Prefix})
	if err != nil {
		t.Fatal(err)
	}
	id := uuid.NewString()
	payload, _ := json.Marshal(chat.Message{ID: id, ChatID: 21, Seq: 5, Body: "again", SentAt: time.Now(), From: chat.Consumers})
	if _, err := pub.Add(ctx, redisq.Job{ID: id, Name: chat.EventMessageCreated, Payload: payload}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, "the conflicting message dead-lettered and counted", func() bool {
		m, err := chattest.Get(work.base + "/metrics")
		return err == nil && strings.Contains(m, "outboxchat_inbox_seq_conflicts_total 1")
	})
	if n := h.Count(t, `SELECT count(*) FROM workers.inbox WHERE message_id = $1`, id); n != 0 {
		t.Fatal("the conflicting message was stored")
	}
}
