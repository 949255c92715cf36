package chat_test

import (
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/chat"
)

// BenchmarkDecodeEvent decodes one message.created payload as the sender
// encodes it (Message.EventJSON: a UUID, a 40-byte body, an author), as the
// receiving inbox does for every delivery. ns/op and allocs/op are per
// message.
func BenchmarkDecodeEvent(b *testing.B) {
	at := time.Date(2026, 12, 2, 18, 0, 0, 123456000, time.UTC)
	p, err := chat.Message{ID: "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", ChatID: 42, Seq: 1234,
		Body: "hello from the bench, a forty byte body", SentAt: at, From: chat.Consumers, Author: "alice"}.EventJSON()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := chat.DecodeEvent(p); err != nil {
			b.Fatal(err)
		}
	}
}
