package receive

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/inbox"
)

// reasonSource remembers each dead letter's reason by delivery ref.
type reasonSource struct {
	recordingSource
	mu      sync.Mutex
	reasons map[string]string
}

func (s *reasonSource) DeadLetter(ctx context.Context, d inbox.Delivery, reason string) error {
	s.mu.Lock()
	if s.reasons == nil {
		s.reasons = map[string]string{}
	}
	s.reasons[d.Ref] = reason
	s.mu.Unlock()
	return s.recordingSource.DeadLetter(ctx, d, reason)
}

// historyChat builds deliveries of one chat of consumers' messages, one id
// per seq unless told otherwise, and reads the workers' side of it.
type historyChat struct {
	t    *testing.T
	h    *chattest.Harness
	chat int64
	ids  map[int64]string
}

func (c *historyChat) msg(seq int64) inbox.Delivery {
	if c.ids[seq] == "" {
		c.ids[seq] = uuid.NewString()
	}
	return c.msgID(seq, c.ids[seq])
}

func (c *historyChat) msgID(seq int64, id string) inbox.Delivery {
	p, _ := json.Marshal(chat.Message{ID: id, ChatID: c.chat, Seq: seq, Body: "b", SentAt: time.Now(), From: chat.Consumers})
	return inbox.Delivery{ID: id, Ref: fmt.Sprint("ref-", id), Name: chat.EventMessageCreated, Payload: p}
}

func (c *historyChat) process(ic *inbox.Consumer, seqs ...int64) {
	c.t.Helper()
	var ds []inbox.Delivery
	for _, s := range seqs {
		ds = append(ds, c.msg(s))
	}
	if err := ic.ProcessBatch(context.Background(), ds); err != nil {
		c.t.Fatal(err)
	}
}

// lastReceipt is the upto of the newest receipt workers enqueued for the
// chat (0 for none).
func (c *historyChat) lastReceipt() int {
	c.t.Helper()
	return c.h.Count(c.t, `SELECT coalesce((SELECT (x->>'upto_seq')::bigint FROM workers.outbox o,
		jsonb_array_elements(o.payload->'chats') x
		WHERE o.event = 'receipt' AND (x->>'chat_id')::bigint = $1 ORDER BY o.id DESC LIMIT 1), 0)`, c.chat)
}

func (c *historyChat) held() string {
	c.t.Helper()
	var s string
	if err := c.h.Admin.QueryRow(context.Background(), `SELECT coalesce(string_agg(seq || ':' || held, ' ' ORDER BY seq), '')
		FROM workers.inbox WHERE chat_id = $1`, c.chat).Scan(&s); err != nil {
		c.t.Fatal(err)
	}
	return s
}

// expect checks the chat's inbox rows (seq:held) and newest receipt.
func (c *historyChat) expect(when, held string, receipt int) {
	c.t.Helper()
	if got := c.held(); got != held {
		c.t.Fatalf("%s: inbox %q, want %q", when, got, held)
	}
	if got := c.lastReceipt(); got != receipt {
		c.t.Fatalf("%s: receipt %d, want %d", when, got, receipt)
	}
}

// An operator's DELETE of a chat's inbox rows does not stall it: the next
// message is stored as contiguous (not held behind the deleted rows), the
// receipt goes on from where it was, a copy of a deleted message (the
// re-drive's) is a duplicate that gets a receipt, not a new row, and a gap
// open when the rows were deleted still holds back the receipt until it is
// filled.
func TestReceiverKeepsWatermarkWhenInboxRowsAreDeleted(t *testing.T) {
	t.Parallel()
	h := chattest.New(t, "")
	_, _, ic, _ := inboxConsumer(t, h, chat.Workers, quietInbox())
	c := &historyChat{t: t, h: h, chat: 7, ids: map[int64]string{}}

	exec := func(sql string) {
		t.Helper()
		if _, err := h.Admin.Exec(context.Background(), strings.ReplaceAll(sql, "$1", fmt.Sprint(c.chat))); err != nil {
			t.Fatal(err)
		}
	}
	deleteAll := `DELETE FROM workers.inbox WHERE chat_id = $1`

	c.process(ic, 1, 2, 3)
	c.expect("1..3", "1:false 2:false 3:false", 3)
	exec(deleteAll)
	c.process(ic, 4)
	c.expect("4 after deleting 1..3", "4:false", 4)

	// A copy of deleted seq 2: not stored again, counted as a duplicate,
	// answered with a receipt.
	dups := h.Count(t, `SELECT count(*) FROM workers.inbox_duplicates WHERE message_id = $1`, c.ids[2])
	c.process(ic, 2)
	c.expect("a copy of deleted 2", "4:false", 4)
	if n := h.Count(t, `SELECT count(*) FROM workers.inbox_duplicates WHERE message_id = $1`, c.ids[2]); n != dups+1 {
		t.Fatalf("copy of deleted seq 2: %d duplicate rows, want %d", n, dups+1)
	}

	// A gap open at the delete (5 and 7 in, 6 missing): everything
	// deleted, the floor is 5, not 7; 6 then makes it 6, and the re-driven
	// 7 is stored again and makes it 7.
	c.process(ic, 5, 7)
	c.expect("5 and 7", "4:false 5:false 7:true", 5)
	exec(deleteAll)
	c.process(ic, 6)
	c.expect("6 after the delete", "6:false", 6)
	c.process(ic, 7)
	c.expect("7 again", "6:false 7:false", 7)

	// Part of a chat deleted (the oldest rows, as retention does): the
	// rest goes on as before.
	c.process(ic, 8, 9)
	exec(`DELETE FROM workers.inbox WHERE chat_id = $1 AND seq <= 8`)
	c.process(ic, 10)
	c.expect("10 after a partial delete", "9:false 10:false", 10)

	// TRUNCATE (no DELETE trigger fires) keeps the floor too.
	exec(`TRUNCATE workers.inbox`)
	c.process(ic, 11)
	c.expect("11 after TRUNCATE", "11:false", 11)
}

// A message whose (chat, seq) the inbox holds under another message id is
// dead-lettered with a reason that says so, not stored and not counted as
// a duplicate, and does not move the receipt; the other messages of its
// batch are stored. Above the chat's floor (the insert's unique key finds
// it), at or below it (looked up: the reason names the message holding
// the seq), and two ids at one seq in one batch.
func TestSeqConflictIsDeadLetteredWithItsReason(t *testing.T) {
	t.Parallel()
	h := chattest.New(t, "")
	pool := h.RolePool(t, chat.Workers)
	ih, err := NewInboxHandler(chat.Workers, nil)
	if err != nil {
		t.Fatal(err)
	}
	src := &reasonSource{}
	ic, err := inbox.NewConsumer(pool, src, ih, quietInbox())
	if err != nil {
		t.Fatal(err)
	}
	c := &historyChat{t: t, h: h, chat: 8, ids: map[int64]string{}}
	conflict := func(d inbox.Delivery, want ...string) {
		t.Helper()
		reason := src.reasons[d.Ref]
		for _, w := range append(want, "seq conflict:") {
			if !strings.Contains(reason, w) {
				t.Fatalf("message %s at seq %s: dead-letter reason %q, want it to contain %q (dead letters %v)", d.ID, want, reason, w, src.deadLetter)
			}
		}
		if n := h.Count(t, `SELECT count(*) FROM workers.inbox WHERE message_id = $1`, d.ID); n != 0 {
			t.Fatal("the conflicting message was stored")
		}
		if n := h.Count(t, `SELECT count(*) FROM workers.inbox_duplicates WHERE message_id = $1`, d.ID); n != 0 {
			t.Fatal("the conflicting message was counted as a duplicate")
		}
	}
	c.process(ic, 1, 2)

	other := c.msgID(2, uuid.NewString())
	if err := ic.ProcessBatch(context.Background(), []inbox.Delivery{other, c.msg(3)}); err != nil {
		t.Fatal(err)
	}
	conflict(other, "(8, 2)")
	if got := c.held(); got != "1:false 2:false 3:false" {
		t.Fatalf("inbox %q, want 1..3 with seq 2 the first message's", got)
	}
	if got := c.lastReceipt(); got != 3 {
		t.Fatalf("receipt %d, want 3", got)
	}

	// At or below the floor: 5 held behind 4, then 4 fills the gap (a
	// gap fill up to 5); another message at 5.
	c.process(ic, 5)
	c.process(ic, 4)
	below := c.msgID(5, uuid.NewString())
	if err := ic.ProcessBatch(context.Background(), []inbox.Delivery{below, c.msg(6)}); err != nil {
		t.Fatal(err)
	}
	conflict(below, "chat 8 seq 5", c.ids[5])

	// Two message ids at one new seq in one batch: the first is stored,
	// the second is the conflict.
	first, second := c.msgID(7, uuid.NewString()), c.msgID(7, uuid.NewString())
	if err := ic.ProcessBatch(context.Background(), []inbox.Delivery{first, second}); err != nil {
		t.Fatal(err)
	}
	conflict(second, "(8, 7)")
	if h.Count(t, `SELECT count(*) FROM workers.inbox WHERE message_id = $1`, first.ID) != 1 {
		t.Fatal("the first message at seq 7 was not stored")
	}
	if len(src.deadLetter) != 3 {
		t.Fatalf("dead letters %v, want the three conflicting messages", src.deadLetter)
	}
	if got := c.lastReceipt(); got != 7 {
		t.Fatalf("receipt %d, want 7", got)
	}
}

// A receipt above the chat's newest message (the other side holds seqs
// this side lost, as after a restore) records a seq floor there, so the
// next send numbers above it; a receipt within the chat's messages
// records none.
func TestReceiptAboveMessagesRecordsSeqFloor(t *testing.T) {
	t.Parallel()
	h := chattest.New(t, "")
	ctx := context.Background()
	_, _, cc, _ := inboxConsumer(t, h, chat.Consumers, quietInbox())
	if _, err := h.Admin.Exec(ctx, `INSERT INTO consumers.messages (chat_id, seq, body) SELECT 1, g, 'b' FROM generate_series(1, 3) g`); err != nil {
		t.Fatal(err)
	}
	rcpt := func(chats ...chat.ReceiptChat) inbox.Delivery {
		id := uuid.NewString()
		p, _ := json.Marshal(map[string]any{"id": id, "chats": chats,
			"received_at": time.Now().Format(time.RFC3339Nano), "from": chat.Workers})
		return inbox.Delivery{ID: id, Ref: "r-" + id, Name: chat.EventReceipt, Payload: p}
	}
	if err := cc.ProcessBatch(ctx, []inbox.Delivery{rcpt(chat.ReceiptChat{ChatID: 1, UptoSeq: 2}, chat.ReceiptChat{ChatID: 2, UptoSeq: 5})}); err != nil {
		t.Fatal(err)
	}
	if err := cc.ProcessBatch(ctx, []inbox.Delivery{rcpt(chat.ReceiptChat{ChatID: 1, UptoSeq: 6})}); err != nil {
		t.Fatal(err)
	}
	var got string
	if err := h.Admin.QueryRow(ctx, `SELECT coalesce(string_agg(chat_id || ':' || seq, ' ' ORDER BY chat_id, seq), '') FROM consumers.seq_floors`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != "1:6 2:5" {
		t.Fatalf("seq floors %q, want 1:6 2:5 (none for the receipt up to 2 of chat 1's 3 messages)", got)
	}
}
