package server

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/internal/testenv"
)

// The receiver's receipts come back: the sender's messages get delivered_at
// in the database, in the history and in a live receipt frame, and a socket
// opened later gets the watermark first.
func TestReceiptsMarkMessagesDelivered(t *testing.T) {
	t.Parallel()
	h, cons, _ := startBoth(t)
	w := chattest.Watch(t, cons.base, 8)
	for i := 1; i <= 5; i++ {
		chattest.Send(t, cons.base, 8, fmt.Sprintf("m%d", i))
	}
	testenv.WaitFor(t, 15*time.Second, "a receipt frame up to seq 5 on the sender's socket", func() bool {
		return w.LastReceipt(chat.Consumers).UptoSeq == 5
	})
	if n := h.Count(t, `SELECT count(*) FROM consumers.messages_with_receipts WHERE chat_id = 8 AND delivered_at IS NOT NULL`); n != 5 {
		t.Fatalf("%d of 5 messages have delivered_at", n)
	}
	// delivered_at is the receiver's inbox commit time: never before the send.
	if n := h.Count(t, `SELECT count(*) FROM consumers.messages_with_receipts m JOIN workers.inbox i ON i.message_id = m.id
		WHERE m.chat_id = 8 AND m.delivered_at >= m.created_at AND m.delivered_at <= i.received_at + interval '1 second'`); n != 5 {
		t.Fatalf("%d of 5 messages have a delivered_at between their send and the receipt", n)
	}
	resp, err := chattest.AuthClient.Get(cons.base + "/api/chats/8/messages")
	if err != nil {
		t.Fatal(err)
	}
	var hist struct{ Messages []chat.Message }
	err = json.NewDecoder(resp.Body).Decode(&hist)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(hist.Messages) != 5 {
		t.Fatalf("history has %d messages, want 5", len(hist.Messages))
	}
	for _, m := range hist.Messages {
		if m.DeliveredAt == nil {
			t.Fatalf("history message %d has no delivered_at", m.Seq)
		}
	}
	late := chattest.Watch(t, cons.base, 8)
	testenv.WaitFor(t, 10*time.Second, "the watermark on a new socket", func() bool {
		return late.LastReceipt(chat.Consumers).UptoSeq == 5
	})
	late.WaitSeqs(t, chat.Consumers, 5, 10*time.Second)
	for _, m := range late.From(chat.Consumers) {
		if m.DeliveredAt == nil {
			t.Fatalf("catch-up frame of seq %d has no delivered_at", m.Seq)
		}
	}
}
