package store

import (
	"context"
	"testing"

	"github.com/outboxchat/outboxchat/outbox"
)

// KNOWN FAILURE (real bug against docs/OPERATING.md's "Deleting history
// by hand is safe too, with any DELETE or TRUNCATE on these tables"; the
// same section lists seq_floors among them): the newest seq floor is the
// only record of a deleted chat's seqs (store.go lastSeqSQL reads
// max(seq) and the newest floor, not the newest receipt), and nothing
// guards it. TRUNCATE messages together with seq_floors (the BEFORE
// TRUNCATE trigger of 008_history_floors.sql:45 writes the floor into a
// table the same statement then empties) or a DELETE of the floors after
// the messages restarts the chat at seq 1, and the kept receipt marks the
// new message delivered before it is published.
// Clearing the chat's
// history in one statement that includes seq_floors (or deleting the
// floors after the messages) hands seq 1 out again, and the kept receipt
// (upto 3) shows the new message delivered before it was even published.
func TestAttackSeqAfterTruncatingMessagesWithFloors(t *testing.T) {
	t.Parallel()
	for _, clear := range []string{
		`TRUNCATE consumers.messages, consumers.seq_floors`,
		`DELETE FROM consumers.messages; DELETE FROM consumers.seq_floors`,
	} {
		t.Run(clear, func(t *testing.T) {
			e := newBatchEnv(t, outbox.WakeAfterCommit)
			ctx := context.Background()
			for range 3 {
				if _, err := e.store.Send(ctx, 1, "b", ""); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := e.h.Admin.Exec(ctx, `INSERT INTO consumers.receipts (chat_id, upto_seq, delivered_at) VALUES (1, 3, now())`); err != nil {
				t.Fatal(err)
			}
			if _, err := e.h.Admin.Exec(ctx, clear); err != nil {
				t.Fatal(err)
			}
			m, err := e.store.Send(ctx, 1, "new", "")
			if err != nil {
				t.Fatal(err)
			}
			delivered := e.count(t, `SELECT count(*) FROM consumers.messages_with_receipts WHERE chat_id = 1 AND delivered_at IS NOT NULL`)
			if m.Seq != 4 || delivered != 0 {
				t.Fatalf("after %q: new message got seq %d (want 4), %d shown delivered (want 0)", clear, m.Seq, delivered)
			}
		})
	}
}
