package receive

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/chat/schema"
	"github.com/outboxchat/outboxchat/inbox"
)

// The batches of two partitions merged into one set of statements
// (QueueMerged, as an inbox.Group runs them) have the effect of each
// partition's QueueBatch: every new message stored once with its own
// result, a repeat within a batch and a message met in the other batch
// taken for duplicates, a malformed delivery rejected in its own batch, the
// receipts they carry applied, and one receipt for both enqueued in the
// first batch's partition's outbox.
// (A message in another partition's stream happens only when N was changed
// without a drain; it is here to check that the merge counts it once.)
func TestInboxHandlerMergedPartitions(t *testing.T) {
	t.Parallel()
	h := chattest.New(t, "")
	ctx := context.Background()
	pool := h.RolePool(t, chat.Workers)
	if err := schema.EnsurePartitions(ctx, pool, chat.Workers, 2); err != nil {
		t.Fatal(err)
	}
	ih, err := NewInboxHandler(chat.Workers, nil)
	if err != nil {
		t.Fatal(err)
	}
	p0, p1 := ih.ForPartition(0), ih.ForPartition(1)
	mk := func(chatID, seq int64) inbox.Delivery {
		id := uuid.NewString()
		p, _ := json.Marshal(chat.Message{ID: id, ChatID: chatID, Seq: seq, Body: "b", SentAt: time.Now(), From: chat.Consumers})
		return inbox.Delivery{ID: id, Name: chat.EventMessageCreated, Payload: p, Ref: id}
	}
	receipt := func(chatID, upto int64) inbox.Delivery {
		id := uuid.NewString()
		p, _ := json.Marshal(chat.Receipt{ID: id, Chats: []chat.ReceiptChat{{ChatID: chatID, UptoSeq: upto}}, ReceivedAt: time.Now(), From: chat.Consumers})
		return inbox.Delivery{ID: id, Name: chat.EventReceipt, Payload: p, Ref: id}
	}
	// Chat 2 is partition 0's, chat 3 partition 1's; each batch also
	// carries a receipt for this side's messages.
	a1, a2 := mk(2, 1), mk(2, 2)
	b1, b2 := mk(3, 1), mk(3, 2)
	ds := [][]inbox.Delivery{
		{a1, a1, a2, {ID: "x", Name: chat.EventMessageCreated, Payload: []byte(`{nope`)}, receipt(4, 7)},
		{b1, a2, b2, receipt(5, 9)},
	}
	rs := [][]inbox.BatchResult{make([]inbox.BatchResult, len(ds[0])), make([]inbox.BatchResult, len(ds[1]))}
	b := &pgx.Batch{}
	if err := p0.QueueMerged(b, []inbox.PipelineHandler{p0, p1}, ds, rs); err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return tx.SendBatch(ctx, b).Close() })
	if err != nil {
		t.Fatal(err)
	}
	want := [][]bool{{true, false, true, false, true}, {true, false, true, true}}
	for i := range rs {
		for j, r := range rs[i] {
			if r.Fresh != want[i][j] {
				t.Fatalf("batch %d delivery %d: fresh %v, want %v (results %+v)", i, j, r.Fresh, want[i][j], rs)
			}
			if r.Fresh && ds[i][j].Name == chat.EventMessageCreated {
				m, ok := r.Value.(chat.Message)
				if !ok || m.ID != ds[i][j].ID || m.ReceivedAt == nil {
					t.Fatalf("batch %d delivery %d: value %+v, want the stored message %s", i, j, r.Value, ds[i][j].ID)
				}
			}
		}
	}
	if rs[0][3].Err == nil {
		t.Fatal("the malformed delivery has no error")
	}
	if n := h.Count(t, `SELECT count(*) FROM workers.inbox`); n != 4 {
		t.Fatalf("inbox rows %d, want 4", n)
	}
	if n := h.Count(t, `SELECT count(*) FROM workers.inbox_duplicates`); n != 2 {
		t.Fatalf("duplicates recorded %d, want 2 (a1 again in its batch, a2 in the other)", n)
	}
	if n := h.Count(t, `SELECT count(*) FROM workers.receipts WHERE (chat_id, upto_seq) IN ((4, 7), (5, 9))`); n != 2 {
		t.Fatalf("receipts recorded %d, want both batches' (chat 4 up to 7, chat 5 up to 9)", n)
	}
	// One receipt covers the chats of both batches' messages, new or
	// duplicate, in partition 0's outbox; partition 1's holds none.
	outbox := func(part int) string {
		table := chat.OutboxTable(chat.Workers, part)
		return pgx.Identifier{chat.Workers, table[len(chat.Workers)+1:]}.Sanitize()
	}
	if n := h.Count(t, `SELECT count(*) FROM `+outbox(1)); n != 0 {
		t.Fatalf("partition 1's outbox holds %d rows, want none (the receipt goes with partition 0's)", n)
	}
	if !p0.TakeReceiptQueued() || p1.TakeReceiptQueued() || p0.TakeReceiptQueued() {
		t.Fatal("TakeReceiptQueued: want true once for partition 0, false for partition 1")
	}
	var chats []byte
	if err := pool.QueryRow(ctx, `SELECT payload->'chats' FROM `+outbox(0)+` WHERE event = $1`, chat.EventReceipt).Scan(&chats); err != nil {
		t.Fatalf("receipt in partition 0's outbox: %v", err)
	}
	var got []chat.ReceiptChat
	if err := json.Unmarshal(chats, &got); err != nil {
		t.Fatal(err)
	}
	if want := []chat.ReceiptChat{{ChatID: 2, UptoSeq: 2}, {ChatID: 3, UptoSeq: 2}}; !slices.Equal(got, want) {
		t.Fatalf("the receipt covers %s, want chats 2 and 3 up to seq 2", chats)
	}
	// A handler of another kind is refused before anything is queued.
	if err := p0.QueueMerged(&pgx.Batch{}, []inbox.PipelineHandler{p0, otherHandler{p1}}, ds, rs); err == nil {
		t.Fatal("QueueMerged with another kind of handler: no error")
	}
}

type otherHandler struct{ *InboxHandler }

// The batches of a shared transaction send one receipt while their chats
// fit in one, each receipt in the outbox of its first batch's partition,
// with the first trace context met.
func TestQueueReceiptsSplitsAtTheChatBound(t *testing.T) {
	t.Parallel()
	ih, err := NewInboxHandler(chat.Workers, nil)
	if err != nil {
		t.Fatal(err)
	}
	hs := []*InboxHandler{ih.ForPartition(0), ih.ForPartition(1), ih.ForPartition(2), ih.ForPartition(3)}
	bts := []*inboxBatch{
		{h: hs[0], chats: []int64{1, 2}},
		{h: hs[1]}, // receipts only: nothing to acknowledge
		{h: hs[2], chats: []int64{3}, fChats: []int64{9}, traced: "00-ab-cd-01"},
		{h: hs[3], chats: []int64{4, 5}, traced: "00-ef-01-01"},
	}
	b := &pgx.Batch{}
	queueReceipts(b, bts, 4)
	if len(b.QueuedQueries) != 2 {
		t.Fatalf("%d emits queued, want 2 (chats 1, 2, 3, 9; then 4, 5)", len(b.QueuedQueries))
	}
	want := []struct {
		sql     string
		chats   []int64
		headers string
	}{
		{hs[0].rq.emit, []int64{1, 2, 3, 9}, `{"traceparent":"00-ab-cd-01"}`},
		{hs[3].rq.emit, []int64{4, 5}, `{"traceparent":"00-ef-01-01"}`},
	}
	for i, q := range b.QueuedQueries {
		w := want[i]
		headers, _ := q.Arguments[2].(*string)
		if q.SQL != w.sql || !slices.Equal(q.Arguments[0].([]int64), w.chats) || headers == nil || *headers != w.headers {
			t.Fatalf("emit %d: chats %v headers %v (own partition's outbox: %v), want %v %s", i, q.Arguments[0], q.Arguments[2], q.SQL == w.sql, w.chats, w.headers)
		}
	}
	for i, want := range []bool{true, false, false, true} {
		if got := hs[i].TakeReceiptQueued(); got != want {
			t.Fatalf("partition %d: TakeReceiptQueued %v, want %v", i, got, want)
		}
	}
}
