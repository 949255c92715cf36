package receive

import (
	"testing"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
)

// KNOWN FAILURE (real bug, docs/OPERATING.md "Deleting history by hand is
// safe too, with any DELETE or TRUNCATE on these tables", and
// inbox_gap_fills is one of the tables it lists): clearing a chat's
// inbox together with its gap fills, in one TRUNCATE (the BEFORE
// TRUNCATE trigger on inbox, 008_history_floors.sql:74, writes the floor
// into inbox_gap_fills, which
// the same statement then truncates) or in two DELETEs, loses the floor.
// The next message is then held behind rows that are gone (re-driven
// forever, invariant c), and a re-driven copy of a deleted message is
// stored, NOTIFYed and shown a second time (invariant c).
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
			attackExec(t, h, clear)
			c.process(ic, 4)
			c.process(ic, 2) // a re-driven copy of deleted seq 2
			c.expect("4, then a copy of 2, after "+clear, "4:false", 4)
		})
	}
}

// KNOWN LIMITATION (skipped; for the lead to decide): a sender restored
// without its last rows (no trigger fires) reuses seq 3 under a new
// message id, and the receiver had already deleted its row for seq 3
// (retention). At or below the floor the handler only looks the (chat,
// seq) up in the inbox; the row is gone, so the new message is counted as
// a duplicate: not stored, not shown, not dead-lettered, not counted as a
// seq conflict, and the receipt (up to the floor) tells the sender it
// was delivered: a silent false ✓✓ (invariants b and d).
// handler.go:121-125 (insertBatch: k.taken IS NULL counts as a duplicate).
func TestAttackRestoredSenderReusesPrunedSeq(t *testing.T) {
	t.Skip("known failure: a reused seq at or below the receiver's floor whose row was deleted is taken for a duplicate (undetectable without keeping deleted rows' ids)")
	t.Parallel()
	h := chattest.New(t, "")
	_, _, ic, src := inboxConsumer(t, h, chat.Workers, quietInbox())
	c := &historyChat{t: t, h: h, chat: 70, ids: map[int64]string{}}
	c.process(ic, 1, 2, 3)
	attackExec(t, h, `DELETE FROM workers.inbox WHERE chat_id = 70`)
	c.ids[3] = "" // the restored sender's new message at seq 3
	c.process(ic, 3)
	if len(src.deadLetter) != 1 {
		t.Fatalf("a new message at pruned seq 3: dead letters %v, receipt %d; want it dead-lettered as a seq conflict, not a duplicate with a receipt",
			src.deadLetter, c.lastReceipt())
	}
}
