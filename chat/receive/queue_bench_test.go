package receive

import (
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/inbox"
)

// BenchmarkQueueBatch100 is the CPU side of one inbox batch of 100 fresh
// message.created deliveries spread over 10 chats, each with a traceparent
// header: QueueBatch decodes them and builds the batch's statements and
// their array arguments (no database: the statements are not sent).
// ns/op and allocs/op are per batch of 100.
func BenchmarkQueueBatch100(b *testing.B) {
	h, err := NewInboxHandler(chat.Workers, nil)
	if err != nil {
		b.Fatal(err)
	}
	at := time.Date(2026, 12, 2, 18, 0, 0, 123456000, time.UTC)
	ds := make([]inbox.Delivery, 100)
	for i := range ds {
		id := uuid.Must(uuid.NewV7()).String()
		p, err := chat.Message{ID: id, ChatID: int64(1 + i%10), Seq: int64(1 + i/10),
			Body: "hello from the bench, a forty byte body", SentAt: at, From: chat.Consumers, Author: "alice"}.EventJSON()
		if err != nil {
			b.Fatal(err)
		}
		ds[i] = inbox.Delivery{Ref: "1764698400000-" + strconv.Itoa(i), ID: id, Name: chat.EventMessageCreated, Payload: p,
			Headers: map[string]string{traceparentHeader: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}
	}
	b.ReportAllocs()
	for b.Loop() {
		rs := make([]inbox.BatchResult, len(ds))
		var batch pgx.Batch
		if err := h.QueueBatch(&batch, ds, rs); err != nil {
			b.Fatal(err)
		}
		if batch.Len() != 3 {
			b.Fatalf("queued %d statements, want 3", batch.Len())
		}
	}
}
