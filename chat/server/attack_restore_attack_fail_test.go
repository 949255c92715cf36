package server

import (
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/chat/internal/chattest"
)

// KNOWN LIMITATION (skipped; restore scenario, detected but not bounded):
// after a sender restore that lost seqs 4..5, its new message at reused
// seq 4 is dead-lettered as a seq conflict, but no receipt ever covers it
// in a quiet chat, so the Redriver publishes it again every RedriveAfter
// and the receiver dead-letters it again, without end (invariant c:
// nothing re-driven forever). Observed: 3 conflicts after 13 s,
// outboxchat_redriven_total 2 (RedriveAfter 4 s). The first later
// message whose receipt covers seq 5 then marks it delivered (documented
// in OPERATING.md "A seq conflict").
func TestAttackRestoredConflictRedrivenForever(t *testing.T) {
	t.Skip("known failure: a seq-conflict dead letter of a restored sender is re-driven and dead-lettered again every RedriveAfter")
	t.Parallel()
	h, cons, work := startBoth(t)
	newFlow(t, h, cons, work, 82, 5)
	attackRestoreSender(t, h, 82, 3)
	chattest.Send(t, cons.base, 82, "after the restore")
	deadline := time.Now().Add(25 * time.Second)
	for time.Now().Before(deadline) {
		if n := attackMetric(t, work.base, "outboxchat_inbox_seq_conflicts_total"); n >= 3 {
			t.Fatalf("the conflicting message was dead-lettered %v times (re-driven %v times): re-driven without end",
				n, attackMetric(t, cons.base, "outboxchat_redriven_total"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}
