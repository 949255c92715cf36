package receive

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/inbox"
)

// The receipt's seq is the end of the run without gaps: a message missing
// in the middle holds it back until it comes; a batch of duplicates only
// still sends one; the sender marks exactly the covered messages.
func TestReceiptWatermarkStopsAtGap(t *testing.T) {
	t.Parallel()
	h := chattest.New(t, "")
	ctx := context.Background()
	_, _, wc, _ := inboxConsumer(t, h, chat.Workers, nil)
	const chatN = 3
	ids := map[int64]string{}
	mk := func(seq int64) inbox.Delivery {
		if ids[seq] == "" {
			ids[seq] = uuid.NewString()
		}
		p, _ := json.Marshal(chat.Message{ID: ids[seq], ChatID: chatN, Seq: seq, Body: "b", SentAt: time.Now(), From: chat.Consumers})
		return inbox.Delivery{ID: ids[seq], Ref: fmt.Sprint("0-", seq), Name: chat.EventMessageCreated, Payload: p}
	}
	receipts := func() []int64 {
		t.Helper()
		rows, err := h.Admin.Query(ctx, `SELECT (c->>'upto_seq')::bigint FROM workers.outbox o,
			jsonb_array_elements(o.payload->'chats') c
			WHERE o.event = 'receipt' AND (c->>'chat_id')::bigint = $1 ORDER BY o.id`, chatN)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []int64
		for rows.Next() {
			var n int64
			if err := rows.Scan(&n); err != nil {
				t.Fatal(err)
			}
			out = append(out, n)
		}
		return out
	}
	steps := []struct {
		batch []int64
		want  []int64
	}{
		{[]int64{1, 2, 4}, []int64{2}},
		{[]int64{3}, []int64{2, 4}},
		{[]int64{1}, []int64{2, 4, 4}}, // duplicates only: a receipt all the same
		{[]int64{6}, []int64{2, 4, 4, 4}},
	}
	for _, st := range steps {
		var ds []inbox.Delivery
		for _, s := range st.batch {
			ds = append(ds, mk(s))
		}
		if err := wc.ProcessBatch(ctx, ds); err != nil {
			t.Fatal(err)
		}
		if got := receipts(); fmt.Sprint(got) != fmt.Sprint(st.want) {
			t.Fatalf("after batch %v: receipts %v, want %v", st.batch, got, st.want)
		}
	}
	// Seq 4 was stored held (behind the gap at 3), and stays so: filling
	// the gap recorded the fill (up to 4) instead; 6 is held behind the
	// gap at 5.
	held := func() string {
		t.Helper()
		var s string
		if err := h.Admin.QueryRow(ctx, `SELECT string_agg(seq || ':' || held, ' ' ORDER BY seq) FROM workers.inbox WHERE chat_id = $1`, chatN).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if got := held(); got != "1:false 2:false 3:false 4:true 6:true" {
		t.Fatalf("inbox seq:held %q, want 1:false 2:false 3:false 4:true 6:true", got)
	}
	if n := h.Count(t, `SELECT max(upto) FROM workers.inbox_gap_fills WHERE chat_id = $1`, chatN); n != 4 {
		t.Fatalf("gap fill up to %d, want 4", n)
	}
	if err := wc.ProcessBatch(ctx, []inbox.Delivery{mk(5)}); err != nil {
		t.Fatal(err)
	}
	if got := receipts(); fmt.Sprint(got) != fmt.Sprint([]int64{2, 4, 4, 4, 6}) {
		t.Fatalf("after seq 5: receipts %v, want [2 4 4 4 6]", got)
	}
	// 5 follows 4, held but covered by the fill: not held; 6 is now
	// covered by a second fill.
	if got := held(); got != "1:false 2:false 3:false 4:true 5:false 6:true" {
		t.Fatalf("after seq 5: inbox seq:held %q, want 1:false 2:false 3:false 4:true 5:false 6:true", got)
	}
	if n := h.Count(t, `SELECT max(upto) FROM workers.inbox_gap_fills WHERE chat_id = $1`, chatN); n != 6 {
		t.Fatalf("gap fill up to %d, want 6", n)
	}
	// And 7 follows 6 (held, covered by the fill): not held, receipt 7.
	if err := wc.ProcessBatch(ctx, []inbox.Delivery{mk(7)}); err != nil {
		t.Fatal(err)
	}
	if got := held(); !strings.HasSuffix(got, "7:false") {
		t.Fatalf("after seq 7: inbox seq:held %q, want 7 not held", got)
	}
	if got := receipts(); fmt.Sprint(got) != fmt.Sprint([]int64{2, 4, 4, 4, 6, 7}) {
		t.Fatalf("after seq 7: receipts %v, want [2 4 4 4 6 7]", got)
	}

	// The sender side: messages 1..6 of consumers; a receipt up to 4 marks
	// 1..4 and no more; a receipt from the wrong side is dead-lettered.
	cpool, err := pgxpool.New(ctx, h.RoleURL(chat.Consumers))
	if err != nil {
		t.Fatal(err)
	}
	defer cpool.Close()
	if _, err := cpool.Exec(ctx, `INSERT INTO consumers.messages (chat_id, seq, body) SELECT $1, g, 'b' FROM generate_series(1, 6) g`, chatN); err != nil {
		t.Fatal(err)
	}
	ch, _ := NewInboxHandler(chat.Consumers, nil)
	src := &recordingSource{}
	cc, err := inbox.NewConsumer(cpool, src, ch, nil)
	if err != nil {
		t.Fatal(err)
	}
	rcpt := func(upto int64, from string) inbox.Delivery {
		id := uuid.NewString()
		p, _ := json.Marshal(map[string]any{"id": id, "chats": []chat.ReceiptChat{{ChatID: chatN, UptoSeq: upto}, {ChatID: 999, UptoSeq: 1}},
			"received_at": time.Now().Format(time.RFC3339Nano), "from": from})
		return inbox.Delivery{ID: id, Ref: "r-" + id, Name: chat.EventReceipt, Payload: p}
	}
	if err := cc.ProcessBatch(ctx, []inbox.Delivery{rcpt(2, chat.Workers), rcpt(4, chat.Workers), rcpt(5, chat.Consumers)}); err != nil {
		t.Fatal(err)
	}
	if n := h.Count(t, `SELECT count(*) FROM consumers.messages_with_receipts WHERE chat_id = $1 AND delivered_at IS NOT NULL`, chatN); n != 4 {
		t.Fatalf("%d messages delivered, want 4 (seqs 1..4)", n)
	}
	if n := h.Count(t, `SELECT max(seq) FROM consumers.messages_with_receipts WHERE chat_id = $1 AND delivered_at IS NOT NULL`, chatN); n != 4 {
		t.Fatalf("highest delivered seq %d, want 4", n)
	}
	if len(src.deadLetter) != 1 {
		t.Fatalf("dead-lettered %v, want the receipt from the wrong side", src.deadLetter)
	}
	// Applying an older receipt again changes nothing.
	if err := cc.ProcessBatch(ctx, []inbox.Delivery{rcpt(1, chat.Workers)}); err != nil {
		t.Fatal(err)
	}
	if n := h.Count(t, `SELECT count(*) FROM consumers.messages_with_receipts WHERE chat_id = $1 AND delivered_at IS NOT NULL`, chatN); n != 4 {
		t.Fatalf("%d messages delivered after a stale receipt, want 4", n)
	}
}

// The receipts' statements on the inbox and receipts tables find rows by
// index even with the plans a connection caches while the tables are
// empty (generic plans, as pgx's prepared statements get after five
// runs): a plan that scanned and sorted a whole chat made each inbox batch
// take 30 ms instead of 1 ms in lab bench.
func TestReceiptStatementsUseIndexesWhenPlannedOnEmptyTables(t *testing.T) {
	t.Parallel()
	h := chattest.New(t, "")
	wh, err := NewInboxHandler(chat.Workers, nil)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := NewInboxHandler(chat.Consumers, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.IndexedScans(t, []string{"inbox", "receipts", "inbox_gap_fills", "messages", "seq_floors"},
		chattest.Statement{Name: "inbox_insert", SQL: wh.insertBatch, Args: `'{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}'`},
		chattest.Statement{Name: "emit", SQL: wh.rq.emit, Args: `'{1,2}', 'workers', NULL`},
		chattest.Statement{Name: "apply", SQL: ch.rq.apply, Args: `'{1}', '{3}', '{2026-11-30 10:00:00+00}'`})
}
