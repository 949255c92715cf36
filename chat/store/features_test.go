package store

import (
	"context"
	"errors"
	"testing"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/outbox"
)

// The latest-first pages, the chat list, the unread count and the change's
// lookups read by index only, in the generic plans a connection caches
// while the tables are empty.
func TestFeatureQueriesUseIndexes(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t, outbox.WakeAfterCommit)
	q := e.store.fq
	scans := e.h.IndexedScans(t, []string{"messages", "inbox", "read_marks", "receipts", "reads"},
		chattest.Statement{Name: "latest_sent", SQL: q.latestSent, Args: `1, 100, 51`},
		chattest.Statement{Name: "latest_recv", SQL: q.latestRecv, Args: `1, 100, 51`},
		chattest.Statement{Name: "chats_all", SQL: q.chatsAll, Args: `51, 'u', now(), 9223372036854775807, 'consumers'`},
		chattest.Statement{Name: "chats_listed", SQL: q.chatsListed, Args: `51, 'u', now(), 9223372036854775807, 'consumers', '{1,2}'`},
		chattest.Statement{Name: "unread", SQL: q.unread, Args: `1, 'u'`},
		chattest.Statement{Name: "lock_own", SQL: q.lockOwn, Args: `'018f0000-0000-7000-8000-000000000000', 1`},
		chattest.Statement{Name: "own_by_id", SQL: q.ownByID, Args: `'018f0000-0000-7000-8000-000000000000', 1`},
	)
	if len(scans) != 7 {
		t.Errorf("scans of %d statements, want 7: %v", len(scans), scans)
	}
}

// Edits and deletes: author only, versions n+1 in commit order, each with
// its event in the outbox in the same transaction; a deleted message keeps
// its row with an empty body and cannot be edited.
func TestChangeVersionsAndOutbox(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t, outbox.WakeAfterCommit)
	ctx := context.Background()
	m, err := e.store.Send(ctx, 7, "first text", "alice")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Change(ctx, 7, m.ID, "not mine", false, "bob"); !errors.Is(err, chat.ErrNotAuthor) {
		t.Fatalf("edit by another user: %v", err)
	}
	if _, err := e.store.Change(ctx, 8, m.ID, "wrong chat", false, "alice"); !errors.Is(err, chat.ErrNoMessage) {
		t.Fatalf("edit in another chat: %v", err)
	}
	got, err := e.store.Change(ctx, 7, m.ID, "second text", false, "alice")
	if err != nil || got.Version != 2 || got.Body != "second text" || got.EditedAt == nil || got.Deleted {
		t.Fatalf("edit: %+v %v", got, err)
	}
	got, err = e.store.Change(ctx, 7, m.ID, "ignored", true, "alice")
	if err != nil || got.Version != 3 || got.Body != "" || !got.Deleted {
		t.Fatalf("delete: %+v %v", got, err)
	}
	if _, err := e.store.Change(ctx, 7, m.ID, "again", false, "alice"); !errors.Is(err, chat.ErrDeletedMessage) {
		t.Fatalf("edit after delete: %v", err)
	}
	rows, err := e.h.Admin.Query(ctx, `SELECT event, (payload->>'version')::int, payload->>'body' FROM consumers.outbox
		WHERE event <> 'message.created' ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var events []string
	for rows.Next() {
		var ev, body string
		var v int
		if err := rows.Scan(&ev, &v, &body); err != nil {
			t.Fatal(err)
		}
		events = append(events, ev+":"+body+":"+string(rune('0'+v)))
	}
	if len(events) != 2 || events[0] != "message.edited:second text:2" || events[1] != "message.deleted::3" {
		t.Fatalf("outbox events: %q", events)
	}
	h, err := e.store.History(ctx, 7, 0, 0, 10)
	if err != nil || len(h.Sent) != 1 || !h.Sent[0].Deleted || h.Sent[0].Version != 3 || h.Sent[0].EditedAt == nil {
		t.Fatalf("history: %+v %v", h, err)
	}
}
