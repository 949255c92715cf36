package gateway

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
)

// BenchmarkGatewayOffer is the gateway's in-process fan-out at the bench's
// shape: 100 rooms with one subscriber each, and each op offers one new
// received message per room (as an inbox commit does) and takes the 100
// frames. ns/op and allocs/op are per 100 messages.
func BenchmarkGatewayOffer(b *testing.B) {
	h := chattest.New(b, "")
	g, err := New(h.Admin, chat.Workers, &Config{Channels: []string{"nobody_notifies_this"}, PollInterval: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	if err := g.Start(b.Context()); err != nil {
		b.Fatal(err)
	}
	defer g.Stop(b.Context())
	const rooms = 100
	subs := make([]*Subscription, rooms)
	for i := range subs {
		subs[i] = g.Subscribe(int64(i+1), 0, 0)
		defer subs[i].Close()
	}
	at := time.Now()
	ms := make([]chat.Message, rooms)
	// Round 1 is stored too: an offer that finds a subscriber still in its
	// first read makes the gateway read the room, which must find it. The
	// later rounds are offered only (stored rows would time Postgres).
	round := func(seq int64, stored bool) {
		for i := range ms {
			ms[i] = chat.Message{ID: uuid.NewString(), ChatID: int64(i + 1), Seq: seq, Body: "bench", SentAt: at, From: chat.Consumers}
			if stored {
				ms[i] = storeReceived(b, h, int64(i+1), seq)
			}
			ms[i].ReceivedAt, ms[i].DeliveredAt = &at, &at
		}
		g.Offer(true, ms)
		for _, s := range subs {
			select {
			case <-s.C:
			case <-time.After(10 * time.Second):
				b.Fatalf("no frame for seq %d within 10 s", seq)
			}
		}
	}
	round(1, true)
	seq := int64(1)
	b.ReportAllocs()
	for b.Loop() {
		seq++
		round(seq, false)
	}
}
