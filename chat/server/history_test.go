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

// A WebSocket opened after a chat's history was deleted on both sides (the
// sender's messages and the receiver's inbox rows; receipts kept) shows the
// chat's new messages on both services at once: its cursors start at 0, the
// deleted seqs are below each side's floor, so they are skipped rather than
// waited for — for good on the sender's own side, for the gap hold on the
// receiver's. Each new message is shown once.
func TestNewSocketAfterDeletedHistoryShowsNewMessages(t *testing.T) {
	t.Parallel()
	h, cons, work := startBoth(t)
	ctx := context.Background()
	const chatID = 61
	sendsArrive(t, work, cons, chatID, 10*time.Second) // seqs 1..3, delivered and receipted
	testenv.WaitFor(t, 10*time.Second, "receipt up to seq 3", func() bool {
		return h.Count(t, `SELECT count(*) FROM consumers.receipts WHERE chat_id = $1 AND upto_seq >= 3`, chatID) > 0
	})
	for _, q := range []string{
		`DELETE FROM consumers.messages WHERE chat_id = $1`,
		`DELETE FROM workers.inbox WHERE chat_id = $1`,
	} {
		if _, err := h.Admin.Exec(ctx, q, chatID); err != nil {
			t.Fatal(err)
		}
	}
	own := chattest.Watch(t, cons.base, chatID)
	peer := chattest.Watch(t, work.base, chatID)
	// Well under the gap hold (at least 2 × the harness's 2 s lock
	// duration): a wait for the deleted seqs would miss it.
	const within = 3 * time.Second
	for seq := int64(4); seq <= 5; seq++ {
		m := chattest.Send(t, cons.base, chatID, fmt.Sprint("after the delete ", seq))
		if m.Seq != seq {
			t.Fatalf("send after the delete got seq %d, want %d", m.Seq, seq)
		}
		for _, w := range []struct {
			name string
			w    *chattest.Watcher
		}{{"the sender's new socket", own}, {"the receiver's new socket", peer}} {
			testenv.WaitFor(t, within, fmt.Sprintf("seq %d on %s", seq, w.name), func() bool {
				return len(w.w.From(chat.Consumers)) >= int(seq-3)
			})
			got := w.w.From(chat.Consumers)
			if len(got) != int(seq-3) || got[len(got)-1].Seq != seq {
				t.Fatalf("%s shows %+v, want seqs 4..%d once each", w.name, got, seq)
			}
		}
	}
}
