package store

import (
	"fmt"
	"testing"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/outbox"
)

// benchRelayBatch is a relay batch of n message.created events over 10
// chats, their payloads in the text form the relay reads them in (jsonb's:
// keys by length, ", " and ": ").
func benchRelayBatch(n int) []outbox.Message {
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{RowID: int64(i + 1), ID: fmt.Sprintf("0193e8a0-7c1d-7b6e-9f00-%012d", i), Event: chat.EventMessageCreated,
			Payload: fmt.Appendf(nil, `{"id": "0193e8a0-7c1d-7b6e-9f00-%012d", "seq": %d, "body": "a message of some forty bytes, <b>bold</b>", "from": "consumers", "author": "user-17", "chat_id": %d, "sent_at": "2026-03-04T05:06:07.891234Z", "delivered_at": null}`,
				i, 1000+i, 1+i%10)}
	}
	return msgs
}

// BenchmarkHighWaterMarks is the seq fence's own work per relay batch of
// 64 events (before its one Redis call): finding each chat's highest seq.
func BenchmarkHighWaterMarks(b *testing.B) {
	msgs := benchRelayBatch(64)
	b.ReportAllocs()
	for b.Loop() {
		if top := highWaterMarks(msgs); len(top) != 10 {
			b.Fatalf("%d chats", len(top))
		}
	}
}
