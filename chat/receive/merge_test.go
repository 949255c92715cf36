package receive

import (
	"context"
	"encoding/json"
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
// taken for duplicates, a malformed delivery rejected in its own batch, and
// each batch's receipt enqueued in its own partition's outbox.
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
	// Chat 2 is partition 0's, chat 3 partition 1's.
	a1, a2 := mk(2, 1), mk(2, 2)
	b1, b2 := mk(3, 1), mk(3, 2)
	ds := [][]inbox.Delivery{
		{a1, a1, a2, {ID: "x", Name: chat.EventMessageCreated, Payload: []byte(`{nope`)}},
		{b1, a2, b2},
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
	want := [][]bool{{true, false, true, false}, {true, false, true}}
	for i := range rs {
		for j, r := range rs[i] {
			if r.Fresh != want[i][j] {
				t.Fatalf("batch %d delivery %d: fresh %v, want %v (results %+v)", i, j, r.Fresh, want[i][j], rs)
			}
			if r.Fresh {
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
	// Each batch's receipt covers the chats of its own messages, new or
	// duplicate (as QueueBatch's does): partition 1's batch carried a2.
	for part, chatIDs := range [][]int64{{2}, {2, 3}} {
		table := chat.OutboxTable(chat.Workers, part)
		var chats []byte
		if err := pool.QueryRow(ctx, `SELECT payload->'chats' FROM `+pgx.Identifier{chat.Workers, table[len(chat.Workers)+1:]}.Sanitize()+
			` WHERE event = $1`, chat.EventReceipt).Scan(&chats); err != nil {
			t.Fatalf("receipt in %s: %v", table, err)
		}
		var got []struct {
			ChatID  int64 `json:"chat_id"`
			UptoSeq int64 `json:"upto_seq"`
		}
		if err := json.Unmarshal(chats, &got); err != nil {
			t.Fatal(err)
		}
		if len(got) != len(chatIDs) {
			t.Fatalf("receipt in %s covers %s, want chats %v up to seq 2", table, chats, chatIDs)
		}
		for k, c := range got {
			if c.ChatID != chatIDs[k] || c.UptoSeq != 2 {
				t.Fatalf("receipt in %s covers %s, want chats %v up to seq 2", table, chats, chatIDs)
			}
		}
	}
	// A handler of another kind is refused before anything is queued.
	if err := p0.QueueMerged(&pgx.Batch{}, []inbox.PipelineHandler{p0, otherHandler{p1}}, ds, rs); err == nil {
		t.Fatal("QueueMerged with another kind of handler: no error")
	}
}

type otherHandler struct{ *InboxHandler }
