package server

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/internal/testenv"
)

// attackMetric reads an unlabelled counter from base's /metrics (0 when
// absent).
func attackMetric(t *testing.T, base, name string) float64 {
	t.Helper()
	m, err := chattest.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	g := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindStringSubmatch(m)
	if g == nil {
		return 0
	}
	v, _ := strconv.ParseFloat(g[1], 64)
	return v
}

// attackRestoreSender models a restore of consumers that lost chatID's
// messages above keep and its receipts above keep: the delete trigger is
// disabled, so no floor is recorded (a restore fires none).
func attackRestoreSender(t *testing.T, h *harness, chatID int64, keep int) {
	t.Helper()
	for _, sql := range []string{
		`ALTER TABLE consumers.messages DISABLE TRIGGER messages_seq_floor`,
		fmt.Sprintf(`DELETE FROM consumers.messages WHERE chat_id = %d AND seq > %d`, chatID, keep),
		`ALTER TABLE consumers.messages ENABLE TRIGGER messages_seq_floor`,
		fmt.Sprintf(`DELETE FROM consumers.receipts WHERE chat_id = %d AND upto_seq > %d`, chatID, keep),
		fmt.Sprintf(`INSERT INTO consumers.receipts (chat_id, upto_seq, delivered_at) VALUES (%d, %d, now()) ON CONFLICT DO NOTHING`, chatID, keep),
	} {
		if _, err := h.Admin.Exec(context.Background(), sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
}

// Attack (b)/(d), sender restored without its last rows while the
// receiver still holds them: the sender hands seq 4 out again (a restore
// fires no trigger: expected), the receiver dead-letters it as a seq
// conflict and counts it, and the sender does not show it delivered.
// Then the chat's next messages get past it: once the sender's seq is
// above the receiver's, the chat flows again.
func TestAttackRestoredSenderConflictIsDetected(t *testing.T) {
	t.Parallel()
	h, cons, work := startBoth(t)
	const chatID = 81
	f := newFlow(t, h, cons, work, chatID, 5)
	attackRestoreSender(t, h, chatID, 3)
	m := chattest.Send(t, cons.base, chatID, "after the restore")
	if m.Seq != 4 {
		t.Fatalf("after the restore: seq %d (expected 4: nothing recorded what was lost)", m.Seq)
	}
	testenv.WaitFor(t, 20*time.Second, "the reused seq 4 dead-lettered as a seq conflict", func() bool {
		return attackMetric(t, work.base, "outboxchat_inbox_seq_conflicts_total") >= 1
	})
	if n := h.Count(t, `SELECT count(*) FROM workers.inbox WHERE message_id = $1`, m.ID); n != 0 {
		t.Fatal("the conflicting message was stored")
	}
	if n := h.Count(t, `SELECT count(*) FROM consumers.messages_with_receipts WHERE id = $1 AND delivered_at IS NOT NULL`, m.ID); n != 0 {
		t.Fatal("the dead-lettered message at reused seq 4 is shown delivered while no receipt covers it")
	}
	if got := len(f.w.From(chat.Consumers)); got != 5 {
		t.Fatalf("socket shows %d messages, want the 5 before the restore", got)
	}
}
