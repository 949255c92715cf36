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
	"github.com/outboxchat/outboxchat/chat/store/prune"
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
	ic, src := reasonConsumer(t, h)
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

func attackExec(t *testing.T, h *chattest.Harness, sql string, args ...any) {
	t.Helper()
	if _, err := h.Admin.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// Attack (b)/(c): deletes in the middle of a chat, of rows held behind a
// gap, of the newest rows only, and a prune that covers every row. The
// receipt never claims a seq not stored, copies of deleted messages are
// duplicates (not stored again), and the chat keeps flowing.
func TestAttackInboxMiddleAndHeldDeletes(t *testing.T) {
	t.Parallel()
	h := chattest.New(t, "")
	_, _, ic, _ := inboxConsumer(t, h, chat.Workers, quietInbox())
	c := &historyChat{t: t, h: h, chat: 31, ids: map[int64]string{}}

	c.process(ic, 1, 2, 3, 4, 5, 6)
	attackExec(t, h, `DELETE FROM workers.inbox WHERE chat_id = $1 AND seq BETWEEN 3 AND 4`, c.chat)
	c.process(ic, 3, 4) // re-driven copies of the deleted rows
	c.expect("copies of deleted middle rows", "1:false 2:false 5:false 6:false", 6)

	// 8 and 9 held behind missing 7; they are deleted by hand (nothing
	// proves 7): the receipt must stay at 6 until 7 and the re-driven
	// 8, 9 arrive.
	c.process(ic, 8, 9)
	c.expect("8, 9 behind 7", "1:false 2:false 5:false 6:false 8:true 9:true", 6)
	attackExec(t, h, `DELETE FROM workers.inbox WHERE chat_id = $1 AND held`, c.chat)
	c.process(ic, 7)
	c.expect("7 after the held rows went", "1:false 2:false 5:false 6:false 7:false", 7)
	c.process(ic, 8, 9)
	c.expect("8, 9 re-driven", "1:false 2:false 5:false 6:false 7:false 8:false 9:false", 9)

	// Newest rows deleted only (the receipt may repeat lower, never
	// claim more): then 10 is not held.
	attackExec(t, h, `DELETE FROM workers.inbox WHERE chat_id = $1 AND seq >= 8`, c.chat)
	c.process(ic, 10)
	c.expect("10 after deleting the newest rows", "1:false 2:false 5:false 6:false 7:false 10:false", 10)

	// A gap open, then a prune covering every row received so far: the
	// held row stays, the rest go; the gap's filler makes it contiguous.
	c.process(ic, 12)
	n, err := prune.Run(context.Background(), h.Admin, prune.Config{Service: chat.Workers, OlderThan: 1, Batch: 1})
	if err != nil {
		t.Fatal(err)
	}
	if n["inbox"] != 6 {
		t.Fatalf("prune took %d inbox rows, want 6 (all but held 12): %v", n["inbox"], n)
	}
	c.expect("after the prune", "12:true", 10)
	c.process(ic, 11)
	c.expect("11 fills the gap", "11:false 12:true", 12)
	c.process(ic, 13)
	c.expect("13", "11:false 12:true 13:false", 13)
}

// Attack (b): inbox deletes and prunes racing the consumer (many
// goroutines, each its own chat, deliveries in random-ish orders with
// copies): after everything is delivered, the newest receipt of each
// chat is exactly its top seq, and no receipt ever exceeded the highest
// seq the consumer had been given contiguously from 1 at that point.
func TestAttackInboxDeletesRacingConsumer(t *testing.T) {
	t.Parallel()
	h := chattest.New(t, "")
	_, _, ic, _ := inboxConsumer(t, h, chat.Workers, quietInbox())
	const chats, top = 4, 30
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		sts := []string{
			`DELETE FROM workers.inbox WHERE seq % 3 = 0`,
			`DELETE FROM workers.inbox WHERE held`,
			`TRUNCATE workers.inbox`,
		}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := h.Admin.Exec(context.Background(), sts[i%len(sts)]); err != nil {
				t.Errorf("%s: %v", sts[i%len(sts)], err)
				return
			}
			if _, err := prune.Run(context.Background(), h.Admin, prune.Config{Service: chat.Workers, OlderThan: 1, Batch: 3}); err != nil {
				t.Errorf("prune: %v", err)
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for k := range chats {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &historyChat{t: t, h: h, chat: int64(40 + k), ids: map[int64]string{}}
			// Send in pairs out of order (2,1), (4,3) … with a copy of the
			// previous pair, then everything again (the re-drive).
			for s := int64(1); s+1 <= top; s += 2 {
				ds := []inbox.Delivery{c.msg(s + 1), c.msg(s)}
				if s > 1 {
					ds = append(ds, c.msg(s-1))
				}
				if err := ic.ProcessBatch(context.Background(), ds); err != nil {
					t.Error(err)
					return
				}
				if got := attackMaxReceipt(t, h, c.chat); got > int(s+1) {
					t.Errorf("chat %d: receipt %d after delivering only 1..%d", c.chat, got, s+1)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-done
	for k := range chats {
		if got := attackMaxReceipt(t, h, int64(40+k)); got != top {
			t.Errorf("chat %d: newest receipt %d, want %d", 40+k, got, top)
		}
	}
}

func attackMaxReceipt(t *testing.T, h *chattest.Harness, chatID int64) int {
	t.Helper()
	return h.Count(t, `SELECT coalesce(max((x->>'upto_seq')::bigint), 0) FROM workers.outbox o,
		jsonb_array_elements(o.payload->'chats') x
		WHERE o.event = 'receipt' AND (x->>'chat_id')::bigint = $1`, chatID)
}

// Attack (d): a sender restored without its last rows (trigger disabled:
// the delete nobody saw) reuses seqs 2 and 3 under new ids while the
// receiver still holds them: each is dead-lettered with a seq-conflict
// reason, neither stored nor counted as a duplicate.
func TestAttackRestoredSenderReusesHeldSeq(t *testing.T) {
	t.Parallel()
	h := chattest.New(t, "")
	ic, src := reasonConsumer(t, h)
	c := &historyChat{t: t, h: h, chat: 51, ids: map[int64]string{}}
	c.process(ic, 1, 2, 3, 4)
	// 4 deleted (floor 4); 2 and 3 still stored.
	attackExec(t, h, `DELETE FROM workers.inbox WHERE chat_id = $1 AND seq = 4`, c.chat)
	for _, seq := range []int64{2, 3, 4} {
		d := c.msgID(seq, uuid.NewString())
		if err := ic.ProcessBatch(context.Background(), []inbox.Delivery{d}); err != nil {
			t.Fatal(err)
		}
		reason := src.reasons[d.Ref]
		stored := h.Count(t, `SELECT count(*) FROM workers.inbox WHERE message_id = $1`, d.ID)
		dup := h.Count(t, `SELECT count(*) FROM workers.inbox_duplicates WHERE message_id = $1`, d.ID)
		if seq == 4 {
			// The receiver no longer holds seq 4: it cannot tell; recorded
			// here as what happens (see the attack_fail file).
			t.Logf("seq 4 under a new id after its row was deleted: reason %q, stored %d, duplicate %d", reason, stored, dup)
			continue
		}
		if !strings.Contains(reason, "seq conflict") || !strings.Contains(reason, fmt.Sprintf("chat %d seq %d", c.chat, seq)) || stored != 0 || dup != 0 {
			t.Fatalf("seq %d under a new id: reason %q, stored %d, duplicate %d; want a seq-conflict dead letter only", seq, reason, stored, dup)
		}
	}
}

// Clearing a chat's inbox together with its gap fills — in one TRUNCATE
// (refused: the floors may not be truncated) or with a DELETE of the gap
// fills after the inbox (the chat's newest floor is put back) — keeps the
// floor: the next message is not held behind rows that are gone, and a
// re-driven copy of a deleted message is a duplicate, not stored again.
func TestAttackInboxFloorLostWithGapFills(t *testing.T) {
	t.Parallel()
	for i, clear := range []string{
		`TRUNCATE workers.inbox, workers.inbox_gap_fills`,
		`DELETE FROM workers.inbox; DELETE FROM workers.inbox_gap_fills`,
	} {
		t.Run(clear, func(t *testing.T) {
			h := chattest.New(t, "")
			_, _, ic, _ := inboxConsumer(t, h, chat.Workers, quietInbox())
			c := &historyChat{t: t, h: h, chat: int64(60 + i), ids: map[int64]string{}}
			c.process(ic, 1, 2, 3)
			c.expect("1..3", "1:false 2:false 3:false", 3)
			want := "4:false"
			if _, err := h.Admin.Exec(context.Background(), clear); err != nil {
				if !strings.Contains(err.Error(), "holds each chat's floor") {
					t.Fatalf("%s: %v", clear, err)
				}
				want = "1:false 2:false 3:false 4:false" // a TRUNCATE of the floors is refused, and clears nothing
			}
			c.process(ic, 4)
			c.process(ic, 2) // a re-driven copy of deleted seq 2
			c.expect("4, then a copy of 2, after "+clear, want, 4)
		})
	}
}

// reasonConsumer is the workers' inbox consumer on a role pool of h, fed by
// a reasonSource that keeps each dead letter's reason.
func reasonConsumer(t *testing.T, h *chattest.Harness) (*inbox.Consumer, *reasonSource) {
	t.Helper()
	ih, err := NewInboxHandler(chat.Workers, nil)
	if err != nil {
		t.Fatal(err)
	}
	src := &reasonSource{}
	ic, err := inbox.NewConsumer(h.RolePool(t, chat.Workers), src, ih, quietInbox())
	if err != nil {
		t.Fatal(err)
	}
	return ic, src
}
