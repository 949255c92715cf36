package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/outbox"
)

// secondStore starts another Store of consumers on e's database, with its
// own pool, writer and committer: a second instance of the service.
func (e *batchEnv) secondStore(t *testing.T) *Store {
	t.Helper()
	return storeOn(t, e.h.RoleURL(chat.Consumers))
}

// storeOn starts a Store of consumers whose pool connects to url.
func storeOn(t *testing.T, url string) *Store {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	w, err := outbox.NewWriter(pool, &outbox.WriterConfig{Table: "consumers.outbox", Mode: outbox.WakeNone})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(pool, &Config{Service: chat.Consumers, Writer: w})
	if err != nil {
		t.Fatal(err)
	}
	s.lockTimeout = time.Minute
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop(context.Background()) })
	return s
}

// sendSeq sends body to chatN through s and returns the stored seq.
func sendSeq(t *testing.T, s *Store, chatN int64, body string) int64 {
	t.Helper()
	m, err := s.Send(context.Background(), chatN, body, "")
	if err != nil {
		t.Fatalf("send to chat %d: %v", chatN, err)
	}
	return m.Seq
}

// TestHintedBatchesTakeOneRoundTrip: once a chat's first batch has read
// its last seq, its later batches are numbered from the hint and commit in
// one round trip, with seqs 1..N, one outbox event each and sent_at equal
// to the stored created_at.
func TestHintedBatchesTakeOneRoundTrip(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t, outbox.WakeAfterCommit)
	const n = 20
	for i := range n {
		if seq := sendSeq(t, e.store, 81, "hi"); seq != int64(i+1) {
			t.Fatalf("send %d: seq %d", i, seq)
		}
	}
	if hits := e.store.hints.hits.Load(); hits != n-1 {
		t.Fatalf("%d batches in one round trip, want %d (all but the first)", hits, n-1)
	}
	for _, m := range e.checkConsistent(t) {
		var stored time.Time
		if err := e.h.Admin.QueryRow(context.Background(), `SELECT created_at FROM consumers.messages WHERE id = $1`, m.ID).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		if !stored.Equal(m.SentAt) {
			t.Fatalf("message %d: created_at %v, event's sent_at %v", m.Seq, stored, m.SentAt)
		}
	}
}

// TestStaleHintIsCaughtUnderTheLock: a second instance writes chat 82
// after the first learnt its hint, and a floor above chat 83's messages
// appears (what a receipt records after a restore): the first instance's
// next sends are numbered from the database, not from its stale hints (no
// seq reused, none skipped), and the stale chat sits out the hinted path
// for a while instead of paying a refused round trip per batch.
func TestStaleHintIsCaughtUnderTheLock(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t, outbox.WakeAfterCommit)
	other := e.secondStore(t)
	sendSeq(t, e.store, 82, "first")
	sendSeq(t, e.store, 83, "first")
	if seq := sendSeq(t, other, 82, "from the other instance"); seq != 2 {
		t.Fatalf("other instance: seq %d, want 2", seq)
	}
	if _, err := e.h.Admin.Exec(context.Background(), `INSERT INTO consumers.seq_floors (chat_id, seq) VALUES (83, 50)`); err != nil {
		t.Fatal(err)
	}
	hits := e.store.hints.hits.Load()
	if seq := sendSeq(t, e.store, 82, "after it"); seq != 3 {
		t.Fatalf("chat 82 after the other instance's send: seq %d, want 3", seq)
	}
	if seq := sendSeq(t, e.store, 83, "above the floor"); seq != 51 {
		t.Fatalf("chat 83 after a floor at 50: seq %d, want 51", seq)
	}
	if got := e.store.hints.hits.Load(); got != hits {
		t.Fatalf("%d batches committed from a stale hint", got-hits)
	}
	for i := range 3 {
		if seq := sendSeq(t, e.store, 82, "again"); seq != int64(4+i) {
			t.Fatalf("chat 82, send %d after: seq %d", i, seq)
		}
	}
	if got := e.store.hints.hits.Load(); got != hits {
		t.Fatalf("chat 82 took the hinted path %d times within its cooldown", got-hits)
	}
	// checkConsistent wants seqs without gaps, which chat 83's floor makes.
	if n := e.count(t, `SELECT count(DISTINCT seq) FROM consumers.messages WHERE chat_id = 82 AND seq BETWEEN 1 AND 6`); n != 6 {
		t.Fatalf("chat 82 holds %d of seqs 1..6", n)
	}
	if n, m := e.count(t, `SELECT count(*) FROM consumers.outbox`), e.count(t, `SELECT count(*) FROM consumers.messages`); n != m || m != 8 {
		t.Fatalf("%d outbox events for %d messages, want 8 of each", n, m)
	}
}

// TestHintedBatchReplaysAStoredKey: a key already stored refuses the
// hinted batch at the unique index; the batch then runs in two round
// trips and answers the stored message, storing nothing.
func TestHintedBatchReplaysAStoredKey(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t, outbox.WakeAfterCommit)
	ctx := context.Background()
	first, _, err := e.store.SendIdempotent(ctx, 86, "once", "k1", "")
	if err != nil {
		t.Fatal(err)
	}
	again, replayed, err := e.store.SendIdempotent(ctx, 86, "once", "k1", "")
	if err != nil || !replayed || !sameMessage(again, first) {
		t.Fatalf("repeat: %+v replayed %v, %v; first %+v", again, replayed, err, first)
	}
	if _, _, err := e.store.SendIdempotent(ctx, 86, "another body", "k1", ""); !errors.Is(err, chat.ErrIdempotencyConflict) {
		t.Fatalf("same key, other body: %v, want ErrIdempotencyConflict", err)
	}
	if seq := sendSeq(t, e.store, 86, "next"); seq != 2 {
		t.Fatalf("next send: seq %d, want 2", seq)
	}
	if n := e.count(t, `SELECT count(*) FROM consumers.messages WHERE chat_id = 86`); n != 2 {
		t.Fatalf("%d messages, want 2", n)
	}
	e.checkConsistent(t)
}

// TestHintedBatchLeavesALockedChat: while another session holds chat 84's
// lock, a batch hinted for it is refused, the chat's send waits in its
// slow lane and other chats' sends commit; once the lock is free the send
// is numbered on from the hint's seq.
func TestHintedBatchLeavesALockedChat(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t, outbox.WakeAfterCommit)
	sendSeq(t, e.store, 84, "before")
	release := e.lockChat(t, 84)
	waiting := e.goSend(context.Background(), 84, "while locked")
	e.waitBlocked(t)
	if seq := sendSeq(t, e.store, 85, "elsewhere"); seq != 1 {
		t.Fatalf("chat 85: seq %d", seq)
	}
	release(false)
	if o := <-waiting; o.err != nil || o.m.Seq != 2 {
		t.Fatalf("send to the locked chat: %+v", o)
	}
	e.checkConsistent(t)
}
