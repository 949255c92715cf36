package store

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/chat/store/prune"
	"github.com/outboxchat/outboxchat/outbox"
)

// A chat's seq never goes backwards whatever deletes its messages: an
// operator's DELETE of all of a chat's rows, with its receipts deleted too
// or kept, of its newest rows only, of every chat's rows at once, or a
// TRUNCATE; the
// group-commit path and the v1 dual writer's alike. A floor above the
// chat's rows (recorded by a receipt for seqs this side lost) moves the
// next seq above it too.
func TestSeqNeverGoesBackwardsAfterDeletes(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t, outbox.WakeAfterCommit)
	ctx := context.Background()
	send := func(chatID int64) int64 {
		t.Helper()
		m, err := e.store.Send(ctx, chatID, "b", "")
		if err != nil {
			t.Fatal(err)
		}
		return m.Seq
	}
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := e.h.Admin.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	for range 3 {
		send(1)
		send(2)
		send(3)
	}
	exec(`INSERT INTO consumers.receipts (chat_id, upto_seq, delivered_at) VALUES (1, 3, now()), (2, 3, now())`)

	// Chat 1: messages and receipts deleted.
	exec(`DELETE FROM consumers.messages WHERE chat_id = 1`)
	exec(`DELETE FROM consumers.receipts WHERE chat_id = 1`)
	if got := send(1); got != 4 {
		t.Fatalf("chat 1 after deleting its messages and receipts: seq %d, want 4", got)
	}
	// Chat 2: messages deleted, receipts kept; the new message is not
	// covered by the old receipt.
	exec(`DELETE FROM consumers.messages WHERE chat_id = 2`)
	if got := send(2); got != 4 {
		t.Fatalf("chat 2 after deleting its messages: seq %d, want 4", got)
	}
	if n := e.count(t, `SELECT count(*) FROM consumers.messages_with_receipts WHERE chat_id = 2 AND delivered_at IS NOT NULL`); n != 0 {
		t.Fatalf("chat 2: %d messages shown delivered, want 0 (the receipt covers deleted seqs only)", n)
	}
	// Chat 3: its newest message deleted.
	exec(`DELETE FROM consumers.messages WHERE chat_id = 3 AND seq = 3`)
	if got := send(3); got != 4 {
		t.Fatalf("chat 3 after deleting its newest message: seq %d, want 4", got)
	}
	// Every chat at once, then the dual writer's path.
	exec(`DELETE FROM consumers.messages`)
	var m chat.Message
	at := sendClock().Add(-time.Hour) // not Postgres's now(): created_at is the sender's clock
	err := pgx.BeginFunc(ctx, e.store.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, e.store.q.lockChat, int64(1)); err != nil {
			return err
		}
		return tx.QueryRow(ctx, e.store.q.insertOne, int64(1), "b", "", at).Scan(&m.ID, &m.Seq, &m.SentAt)
	})
	if err != nil {
		t.Fatal(err)
	}
	if m.Seq != 5 {
		t.Fatalf("chat 1, dual writer, after deleting every message: seq %d, want 5", m.Seq)
	}
	if !m.SentAt.Equal(at) {
		t.Fatalf("chat 1, dual writer: created_at %v, want the sender's %v", m.SentAt, at)
	}
	for c := int64(2); c <= 3; c++ {
		if got := send(c); got != 5 {
			t.Fatalf("chat %d after deleting every message: seq %d, want 5", c, got)
		}
	}
	// Chat 4: never sent here, but a floor at 7 (what a receipt above
	// the chat's rows records) says seqs up to 7 are taken.
	exec(`INSERT INTO consumers.seq_floors (chat_id, seq) VALUES (4, 7)`)
	if got := send(4); got != 8 {
		t.Fatalf("chat 4 with a floor at 7: seq %d, want 8", got)
	}
	// TRUNCATE (no DELETE trigger fires) records the floors too.
	exec(`TRUNCATE consumers.messages`)
	if got := send(4); got != 9 {
		t.Fatalf("chat 4 after TRUNCATE: seq %d, want 9", got)
	}
}

// The send's last-seq read finds each chat's rows by index even with the
// plans a connection caches while the tables are empty (generic plans, as
// pgx's prepared statements get after five runs).
func TestLastSeqsUsesIndexesWhenPlannedOnEmptyTables(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t, outbox.WakeAfterCommit)
	scans := e.h.IndexedScans(t, []string{"messages", "seq_floors"},
		chattest.Statement{Name: "last_seqs", SQL: e.store.q.lastSeqs, Args: `'{1,2}'`},
		chattest.Statement{Name: "insert_one", SQL: e.store.q.insertOne, Args: `1, 'b', '', now()`})
	for name, n := range scans {
		if n != 2 {
			t.Errorf("%s: %d scans of messages and seq_floors, want 2", name, n)
		}
	}
	if len(scans) != 2 {
		t.Errorf("scans of %d statements, want 2: %v", len(scans), scans)
	}
}

// Attack (a): a chat's seq is never handed out twice while sends run
// concurrently with hand DELETEs (a middle range, the newest row, every
// row of the chat), TRUNCATEs and prunes that cover everything. Every seq
// a send returned is unique per chat, and each goroutine's seqs of a chat
// strictly increase.
func TestAttackSeqUniqueUnderConcurrentDeletes(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t, outbox.WakeAfterCommit)
	ctx := context.Background()
	const chats, senders, perSender = 3, 6, 25
	var mu sync.Mutex
	seen := map[[2]int64]bool{}
	var dup []string
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			last := map[int64]int64{}
			for i := range perSender {
				c := int64((g+i)%chats + 1)
				m, err := e.store.Send(ctx, c, "b", "")
				if err != nil {
					t.Errorf("send: %v", err)
					return
				}
				mu.Lock()
				k := [2]int64{c, m.Seq}
				if seen[k] || m.Seq <= last[c] {
					dup = append(dup, fmt.Sprintf("chat %d seq %d (this sender's last %d)", c, m.Seq, last[c]))
				}
				seen[k] = true
				mu.Unlock()
				last[c] = m.Seq
			}
		}()
	}
	deleter := make(chan struct{})
	go func() {
		defer close(deleter)
		sts := []string{
			`DELETE FROM consumers.messages WHERE chat_id = 1 AND seq BETWEEN 2 AND (SELECT max(seq) - 1 FROM consumers.messages WHERE chat_id = 1)`,
			`DELETE FROM consumers.messages WHERE (chat_id, seq) IN (SELECT chat_id, max(seq) FROM consumers.messages GROUP BY chat_id)`,
			`DELETE FROM consumers.messages WHERE chat_id = 2`,
			`TRUNCATE consumers.messages`,
			`INSERT INTO consumers.receipts (chat_id, upto_seq, delivered_at) SELECT chat_id, max(seq), now() - interval '1 hour' FROM consumers.messages GROUP BY chat_id ON CONFLICT DO NOTHING`,
		}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := e.h.Admin.Exec(ctx, sts[i%len(sts)]); err != nil {
				t.Errorf("%s: %v", sts[i%len(sts)], err)
				return
			}
			if i%len(sts) == len(sts)-1 {
				if _, err := prune.Run(ctx, e.h.Admin, prune.Config{Service: "consumers", OlderThan: time.Nanosecond, Batch: 2}); err != nil {
					t.Errorf("prune: %v", err)
					return
				}
			}
		}
	}()
	wg.Wait()
	close(stop)
	<-deleter
	if len(dup) > 0 {
		t.Fatalf("seqs handed out twice or going backwards: %v", dup)
	}
	if len(seen) != senders*perSender {
		t.Fatalf("%d distinct (chat, seq), want %d", len(seen), senders*perSender)
	}
}

// Clearing a chat's history together with the seq floors — in one
// TRUNCATE (refused: the floors may not be truncated) or with a DELETE of
// the floors after the messages (the chat's newest floor is put back) —
// does not hand seq 1 out again, and the kept receipt (upto 3) marks no new
// message delivered.
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
			if _, err := e.h.Admin.Exec(ctx, clear); err != nil && !strings.Contains(err.Error(), "holds each chat's floor") {
				t.Fatal(err) // a TRUNCATE of the floors is refused, and clears nothing
			}
			m, err := e.store.Send(ctx, 1, "new", "")
			if err != nil {
				t.Fatal(err)
			}
			delivered := e.count(t, `SELECT count(*) FROM consumers.messages_with_receipts WHERE chat_id = 1 AND seq > 3 AND delivered_at IS NOT NULL`)
			if m.Seq != 4 || delivered != 0 {
				t.Fatalf("after %q: new message got seq %d (want 4), %d new ones shown delivered (want 0)", clear, m.Seq, delivered)
			}
		})
	}
}
