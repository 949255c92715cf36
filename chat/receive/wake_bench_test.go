package receive

import (
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/inbox"
)

// BenchmarkWakerTake is one wake-up's bookkeeping at the bench's load: an
// inbox commit of 100 messages over 100 chats and a receipt for 100
// chats recorded (Committed), then turned into NOTIFY payloads (take).
// Nothing is sent.
func BenchmarkWakerTake(b *testing.B) {
	h := chattest.New(b, "")
	w, err := NewWaker(h.RolePool(b, chat.Workers), chat.Workers, nil)
	if err != nil {
		b.Fatal(err)
	}
	applied := make([]inbox.Applied, 0, 101)
	r := chat.Receipt{ReceivedAt: time.Now()}
	for id := int64(1); id <= 100; id++ {
		applied = append(applied, inbox.Applied{Value: chat.Message{ChatID: id}})
		r.Chats = append(r.Chats, chat.ReceiptChat{ChatID: id, UptoSeq: 1000 + id})
	}
	applied = append(applied, inbox.Applied{Value: r})
	b.ReportAllocs()
	for b.Loop() {
		w.Committed(applied)
		if c, _ := w.take(); len(c) != 2 {
			b.Fatalf("%d notifications, want 2", len(c))
		}
	}
}
