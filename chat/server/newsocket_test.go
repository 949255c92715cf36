package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/internal/testenv"
)

// A WebSocket opened after a chat's history was deleted on both sides (the
// sender's messages and the receiver's inbox rows; receipts kept) shows the
// chat's new messages on both services at once: its cursors start at 0, the
// deleted seqs are below each side's floor, so they are skipped rather than
// waited for — for good on the sender's own side, for the gap hold on the
// receiver's. Each new message is shown once.
func TestNewSocketAfterDeletedHistoryShowsNewMessages(t *testing.T) {
	t.Parallel()
	h, cons, work := startBoth(t)
	ctx := context.Background()
	const chatID = 61
	sendsArrive(t, work, cons, chatID, 10*time.Second) // seqs 1..3, delivered and receipted
	testenv.WaitFor(t, 10*time.Second, "receipt up to seq 3", func() bool {
		return h.Count(t, `SELECT count(*) FROM consumers.receipts WHERE chat_id = $1 AND upto_seq >= 3`, chatID) > 0
	})
	for _, q := range []string{
		`DELETE FROM consumers.messages WHERE chat_id = $1`,
		`DELETE FROM workers.inbox WHERE chat_id = $1`,
	} {
		if _, err := h.Admin.Exec(ctx, q, chatID); err != nil {
			t.Fatal(err)
		}
	}
	own := chattest.Watch(t, cons.base, chatID)
	peer := chattest.Watch(t, work.base, chatID)
	// Well under the gap hold (at least 2 × the harness's 2 s lock
	// duration): a wait for the deleted seqs would miss it.
	const within = 3 * time.Second
	for seq := int64(4); seq <= 5; seq++ {
		m := chattest.Send(t, cons.base, chatID, fmt.Sprint("after the delete ", seq))
		if m.Seq != seq {
			t.Fatalf("send after the delete got seq %d, want %d", m.Seq, seq)
		}
		for _, w := range []struct {
			name string
			w    *chattest.Watcher
		}{{"the sender's new socket", own}, {"the receiver's new socket", peer}} {
			testenv.WaitFor(t, within, fmt.Sprintf("seq %d on %s", seq, w.name), func() bool {
				return len(w.w.From(chat.Consumers)) >= int(seq-3)
			})
			got := w.w.From(chat.Consumers)
			if len(got) != int(seq-3) || got[len(got)-1].Seq != seq {
				t.Fatalf("%s shows %+v, want seqs 4..%d once each", w.name, got, seq)
			}
		}
	}
}
