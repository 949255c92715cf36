package receive

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/chat/schema"
	"github.com/outboxchat/outboxchat/inbox"
)

// BenchmarkQueueMerged4x25 stores, per op, the batches of 4 partitions (25
// fresh messages of 5 chats each, all of the partition's own chats) in one
// inbox transaction through QueueMerged, as an inbox.Group runs them at
// --partitions 4: the statements, the round trip and the commit. It reports
// the receipt rows the transaction enqueued (receipts/op).
func BenchmarkQueueMerged4x25(b *testing.B) {
	const parts, per = 4, 25
	h := chattest.New(b, "")
	ctx := context.Background()
	pool := h.RolePool(b, chat.Workers)
	if err := schema.EnsurePartitions(ctx, pool, chat.Workers, parts); err != nil {
		b.Fatal(err)
	}
	ih, err := NewInboxHandler(chat.Workers, nil)
	if err != nil {
		b.Fatal(err)
	}
	hs := make([]inbox.PipelineHandler, parts)
	for p := range parts {
		hs[p] = ih.ForPartition(p)
	}
	seq := map[int64]int64{}
	ds := make([][]inbox.Delivery, parts)
	rs := make([][]inbox.BatchResult, parts)
	for p := range parts {
		ds[p], rs[p] = make([]inbox.Delivery, per), make([]inbox.BatchResult, per)
	}
	b.ResetTimer()
	for range b.N {
		for p := range parts {
			for i := range per {
				c := int64(1 + p + parts*(i%5)) // chat c is partition c mod parts's
				seq[c]++
				id := uuid.NewString()
				pl, _ := json.Marshal(chat.Message{ID: id, ChatID: c, Seq: seq[c], Body: "bench", SentAt: time.Now(), From: chat.Consumers})
				ds[p][i] = inbox.Delivery{Ref: id, ID: id, Name: chat.EventMessageCreated, Payload: pl}
			}
			clear(rs[p])
		}
		bt := &pgx.Batch{}
		if err := hs[0].(inbox.MergeHandler).QueueMerged(bt, hs, ds, rs); err != nil {
			b.Fatal(err)
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return tx.SendBatch(ctx, bt).Close() }); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	n := 0
	for p := range parts {
		n += h.Count(b, fmt.Sprintf(`SELECT count(*) FROM %s WHERE event = '%s'`, chat.OutboxTable(chat.Workers, p), chat.EventReceipt))
	}
	b.ReportMetric(float64(n)/float64(b.N), "receipts/op")
}
