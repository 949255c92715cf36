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

// flow is one chat of consumers' messages to a WebSocket client of workers.
type flow struct {
	t          *testing.T
	h          *harness
	cons, work *running
	chat       int64
	w          *chattest.Watcher
}

// newFlow opens the client of chatID and sends seqs 1..n (see send).
func newFlow(t *testing.T, h *harness, cons, work *running, chatID int64, n int) *flow {
	t.Helper()
	f := &flow{t: t, h: h, cons: cons, work: work, chat: chatID, w: chattest.Watch(t, work.base, chatID)}
	f.send(1, n)
	return f
}

// send sends seqs from..to, checks each got its seq, and waits until the
// client has exactly 1..to, in order, and the receipts cover to.
func (f *flow) send(from, to int) {
	f.t.Helper()
	for i := from; i <= to; i++ {
		if m := chattest.Send(f.t, f.cons.base, f.chat, fmt.Sprint("message ", i)); m.Seq != int64(i) {
			f.t.Fatalf("chat %d: message %d got seq %d", f.chat, i, m.Seq)
		}
	}
	f.w.WaitSeqs(f.t, chat.Consumers, to, 20*time.Second)
	testenv.WaitFor(f.t, 20*time.Second, fmt.Sprintf("chat %d: receipt up to %d", f.chat, to), func() bool {
		return f.h.Count(f.t, `SELECT coalesce(max(upto_seq), 0) FROM consumers.receipts WHERE chat_id = $1`, f.chat) == to
	})
}

// An operator deletes a quiet chat's history by hand on the sender, the
// receiver or both, with the sender's receipts deleted too or kept, while
// a WebSocket client of the receiver stays open at the chat's last seq:
// the next messages get the next seqs, reach that client, and are marked
// delivered by receipts that cover them and nothing else; nothing is
// dead-lettered. A message at a seq the receiver holds under another id
// is dead-lettered and counted.
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
	flows := map[int64]*flow{}
	for _, c := range cases {
		flows[c.chat] = newFlow(t, h, cons, work, c.chat, 3)
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
		flows[c.chat].send(4, 5)
		if n := h.Count(t, `SELECT count(*) FROM consumers.messages_with_receipts
			WHERE chat_id = $1 AND delivered_at < created_at`, c.chat); n != 0 {
			t.Fatalf("chat %d (sender %v, receipts %v, inbox %v): %d messages marked delivered before they were sent",
				c.chat, c.sender, c.receipts, c.inbox, n)
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
