package gateway

import (
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/chat"
)

// BenchmarkEncodeFrame encodes one received message's frame (encodeFrame),
// as the gateway does once per pushed message: a UUID, a 40-byte body, an
// author, sent, received and delivered times. ns/op and allocs/op are per
// frame.
func BenchmarkEncodeFrame(b *testing.B) {
	at := time.Date(2026, 12, 2, 18, 0, 0, 123456000, time.UTC)
	recv := at.Add(3 * time.Millisecond)
	m := chat.Message{ID: "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", ChatID: 42, Seq: 1234,
		Body: "hello from the bench, a forty byte body", SentAt: at, From: chat.Consumers, Author: "alice",
		ReceivedAt: &recv, DeliveredAt: &recv, Version: 1}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := encodeFrame(m); err != nil {
			b.Fatal(err)
		}
	}
}
