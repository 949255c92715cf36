package receive

import (
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/inbox"
)

// BenchmarkQueueBatch100 is the CPU side of one inbox batch of 100 fresh
// message.created deliveries spread over 10 chats, each with a traceparent
// header: QueueBatch decodes them and builds the batch's statements and
// their array arguments, then pgx encodes the insert's arguments as it
// does to send them ("+encode"; no database: nothing is sent). ns/op and
// allocs/op are per batch of 100.
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
	// The insert's parameter types, as Postgres describes the prepared
	// statement.
	insert := &pgconn.StatementDescription{SQL: h.insertBatch, ParamOIDs: []uint32{
		pgtype.UUIDArrayOID, pgtype.Int8ArrayOID, pgtype.Int8ArrayOID, pgtype.TextArrayOID, pgtype.TextArrayOID,
		pgtype.TimestamptzArrayOID, pgtype.UUIDArrayOID, pgtype.TextArrayOID, pgtype.TextArrayOID, pgtype.TextArrayOID}}
	types := pgtype.NewMap()
	for _, encode := range []bool{false, true} {
		name := "queue"
		if encode {
			name = "queue+encode"
		}
		b.Run(name, func(b *testing.B) {
			var eqb pgx.ExtendedQueryBuilder
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
				if q := batch.QueuedQueries[1]; encode {
					if q.SQL != h.insertBatch {
						b.Fatalf("statement 1 is not the insert: %.40s", q.SQL)
					}
					if err := eqb.Build(types, insert, q.Arguments); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
