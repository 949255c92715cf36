package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/chat/schema"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/outbox"
)

// batchEnv is a started Store of consumers on a fresh database, with an
// admin pool to inspect it and to hold chat rows' locks.
type batchEnv struct {
	h     *chattest.Harness
	store *Store
}

func newBatchEnv(t *testing.T, mode outbox.WakeMode) *batchEnv {
	t.Helper()
	h := chattest.New(t, "")
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, h.RoleURL(chat.Consumers))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	w, err := outbox.NewWriter(pool, &outbox.WriterConfig{Table: "consumers.outbox", Mode: mode})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	s, err := New(pool, &Config{Service: chat.Consumers, Writer: w})
	if err != nil {
		t.Fatal(err)
	}
	// Tests hold locks for as long as they need: waits end by release.
	s.lockTimeout = time.Minute
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(context.Background()); err != nil {
			t.Errorf("stop store: %v", err)
		}
	})
	return &batchEnv{h: h, store: s}
}

// count runs a count(*) query on the admin pool.
func (e *batchEnv) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := e.h.Admin.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// lockChat starts an admin transaction that holds chat's advisory lock
// (the lock every send to chat takes), so sends to chat wait in its slow
// lane. The returned func commits or rolls back (either releases it).
func (e *batchEnv) lockChat(t *testing.T, chatN int64) (release func(commit bool)) {
	t.Helper()
	return e.hold(t, `SELECT pg_advisory_xact_lock(`+schema.ChatLockSQL(chat.Consumers, "$1::bigint")+`)`, chatN)
}

// blockCommitter starts an admin transaction that locks consumers.messages
// (ACCESS EXCLUSIVE), so the next send transaction waits on it in its first
// round trip (reading the chats' last seqs), before any write, while later
// sends queue behind it. The returned func commits or rolls back. Reads of
// consumers.messages wait too until then.
func (e *batchEnv) blockCommitter(t *testing.T) (release func(commit bool)) {
	t.Helper()
	return e.hold(t, `LOCK TABLE consumers.messages IN ACCESS EXCLUSIVE MODE`)
}

// hold runs sql in an admin transaction left open until the returned func
// (or the test's cleanup) ends it.
func (e *batchEnv) hold(t *testing.T, sql string, args ...any) (release func(commit bool)) {
	t.Helper()
	ctx := context.Background()
	tx, err := e.h.Admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, sql, args...); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func(commit bool) {
		once.Do(func() {
			var err error
			if commit {
				err = tx.Commit(ctx)
			} else {
				err = tx.Rollback(ctx)
			}
			if err != nil {
				t.Errorf("release lock: %v", err)
			}
		})
	}
	t.Cleanup(func() { release(false) })
	return release
}

// waitBlocked waits until a send transaction waits on a lock (a chat's,
// in its slow lane, or the outbox table's).
func (e *batchEnv) waitBlocked(t *testing.T) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, "committer blocked on the chat lock", func() bool {
		return e.count(t, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND usename = 'consumers' AND wait_event_type = 'Lock'`) == 1
	})
}

// waitQueued waits until n sends are queued behind the running batch.
func (e *batchEnv) waitQueued(t *testing.T, n int) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("%d sends queued", n), func() bool {
		e.store.mu.Lock()
		defer e.store.mu.Unlock()
		return len(e.store.queue) == n
	})
}

type sendOutcome struct {
	m   chat.Message
	err error
}

// goSend sends in a goroutine; the outcome arrives on the returned channel.
func (e *batchEnv) goSend(ctx context.Context, chatN int64, body string) <-chan sendOutcome {
	ch := make(chan sendOutcome, 1)
	go func() {
		m, err := e.store.Send(ctx, chatN, body, "")
		ch <- sendOutcome{m, err}
	}()
	return ch
}

// checkConsistent checks the whole database against invariants 1 and 5:
// per chat, seqs 1..N without gaps; each message has
// exactly one outbox row whose payload is the message; outbox ids ascend
// with seq per chat. It returns the stored messages by id.
func (e *batchEnv) checkConsistent(t *testing.T) map[string]chat.Message {
	t.Helper()
	ctx := context.Background()
	rows, err := e.h.Admin.Query(ctx, `SELECT m.id::text, m.chat_id, m.seq, m.body, m.created_at, o.id, o.event, o.payload::text
		FROM consumers.messages m LEFT JOIN consumers.outbox o ON o.idempotency_key = m.id::text
		ORDER BY m.chat_id, m.seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	stored := map[string]chat.Message{}
	var (
		lastChat, lastSeq, lastOutbox int64
	)
	for rows.Next() {
		var (
			m       chat.Message
			oid     *int64
			event   *string
			payload *string
		)
		if err := rows.Scan(&m.ID, &m.ChatID, &m.Seq, &m.Body, &m.SentAt, &oid, &event, &payload); err != nil {
			t.Fatal(err)
		}
		m.From = chat.Consumers
		if _, dup := stored[m.ID]; dup {
			t.Fatalf("message %s has more than one outbox row", m.ID)
		}
		stored[m.ID] = m
		if m.ChatID != lastChat {
			lastChat, lastSeq, lastOutbox = m.ChatID, 0, 0
		}
		if m.Seq != lastSeq+1 {
			t.Fatalf("chat %d: seq %d follows %d", m.ChatID, m.Seq, lastSeq)
		}
		lastSeq = m.Seq
		if oid == nil {
			t.Fatalf("message %s (chat %d seq %d) has no outbox row", m.ID, m.ChatID, m.Seq)
		}
		if *oid <= lastOutbox {
			t.Fatalf("chat %d: seq %d has outbox id %d, not above the previous seq's %d", m.ChatID, m.Seq, *oid, lastOutbox)
		}
		lastOutbox = *oid
		if *event != chat.EventMessageCreated {
			t.Fatalf("outbox row %d: event %q", *oid, *event)
		}
		got, err := chat.DecodeEvent([]byte(*payload))
		if err != nil {
			t.Fatalf("outbox row %d: %v", *oid, err)
		}
		if !sameMessage(got, m) {
			t.Fatalf("outbox row %d: payload %+v, message row %+v", *oid, got, m)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n := e.count(t, `SELECT count(*) FROM consumers.outbox`); n != len(stored) {
		t.Fatalf("%d outbox rows for %d messages", n, len(stored))
	}
	return stored
}

// checkSent waits for the senders of wg, then (unless one of them failed
// the test: it stops) checks the database with checkConsistent and that it
// holds want messages. It returns the stored messages by id.
func (e *batchEnv) checkSent(t *testing.T, wg *sync.WaitGroup, want int) map[string]chat.Message {
	t.Helper()
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	stored := e.checkConsistent(t)
	if len(stored) != want {
		t.Fatalf("%d messages stored, want %d (a repeated key stores nothing)", len(stored), want)
	}
	return stored
}

func sameMessage(a, b chat.Message) bool {
	return a.ID == b.ID && a.ChatID == b.ChatID && a.Seq == b.Seq && a.Body == b.Body &&
		a.SentAt.Equal(b.SentAt) && a.From == b.From
}

func TestSendBatchConcurrent(t *testing.T) {
	t.Parallel()
	for _, mode := range []outbox.WakeMode{outbox.WakeAfterCommit, outbox.WakeInTx} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			e := newBatchEnv(t, mode)
			const senders, each, chats = 8, 200, 3
			ctx := context.Background()
			var (
				mu   sync.Mutex
				sent []chat.Message
				wg   sync.WaitGroup
			)
			for g := range senders {
				wg.Go(func() {
					var last = map[int64]int64{}
					for i := range each {
						chatN := int64(1 + (g+i)%chats)
						m, err := e.store.Send(ctx, chatN, fmt.Sprintf("g%d m%d", g, i), "")
						if err != nil {
							t.Errorf("send: %v", err)
							return
						}
						// One sender's sends to a chat are sequential: their
						// seqs ascend.
						if m.Seq <= last[chatN] {
							t.Errorf("sender %d chat %d: seq %d after %d", g, chatN, m.Seq, last[chatN])
						}
						last[chatN] = m.Seq
						mu.Lock()
						sent = append(sent, m)
						mu.Unlock()
					}
				})
			}
			stored := e.checkSent(t, &wg, senders*each)
			for _, m := range sent {
				if s, ok := stored[m.ID]; !ok || !sameMessage(s, m) {
					t.Fatalf("returned %+v, stored %+v", m, s)
				}
			}
			txs := e.count(t, `SELECT count(DISTINCT xmin::text) FROM consumers.messages`)
			t.Logf("%d messages in %d transactions", len(stored), txs)
		})
	}
}

// TestSendBatchTakesAllQueued: sends queued while a transaction runs are
// committed together in the next one, each chat's in queue order; a send
// whose ctx ends while queued is dropped and stores nothing.
func TestSendBatchTakesAllQueued(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t, outbox.WakeAfterCommit)
	release := e.blockCommitter(t)
	first := e.goSend(context.Background(), 1, "first")
	e.waitBlocked(t)

	// Queued in a known order, one at a time.
	var queued []<-chan sendOutcome
	cctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var dropped <-chan sendOutcome
	for i := range 7 {
		if i == 3 {
			dropped = e.goSend(cctx, 2, "dropped")
			e.waitQueued(t, i+1)
			continue
		}
		queued = append(queued, e.goSend(context.Background(), int64(1+i%2), fmt.Sprint("q", i)))
		e.waitQueued(t, i+1)
	}
	cancel()
	if o := <-dropped; !errors.Is(o.err, context.Canceled) {
		t.Fatalf("cancelled queued send: got %+v, want context.Canceled", o)
	}
	release(true)
	if o := <-first; o.err != nil || o.m.Seq != 1 {
		t.Fatalf("first send: %+v", o)
	}
	var got []chat.Message
	for _, ch := range queued {
		o := <-ch
		if o.err != nil {
			t.Fatal(o.err)
		}
		got = append(got, o.m)
	}
	// Queued: q0 (chat 1), q1 (2), q2 (1), [dropped (2)], q4 (1), q5 (2), q6 (1).
	want := []struct{ chatN, seq int64 }{{1, 2}, {2, 1}, {1, 3}, {1, 4}, {2, 2}, {1, 5}}
	for i, m := range got {
		if m.ChatID != want[i].chatN || m.Seq != want[i].seq {
			t.Errorf("queued send %d: chat %d seq %d, want chat %d seq %d", i, m.ChatID, m.Seq, want[i].chatN, want[i].seq)
		}
		if !m.SentAt.Equal(got[0].SentAt) {
			t.Errorf("queued send %d: sent_at %v, not the batch's %v", i, m.SentAt, got[0].SentAt)
		}
	}
	stored := e.checkConsistent(t)
	if len(stored) != 7 {
		t.Fatalf("%d messages stored, want 7 (the dropped one must not be)", len(stored))
	}
	if n := e.count(t, `SELECT count(DISTINCT xmin::text) FROM consumers.messages`); n != 2 {
		t.Fatalf("messages committed in %d transactions, want 2", n)
	}
}

func TestSendCancelledStoresNothing(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t, outbox.WakeAfterCommit)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := e.store.Send(ctx, 1, "never", ""); !errors.Is(err, context.Canceled) {
		t.Fatalf("send with cancelled ctx: %v, want context.Canceled", err)
	}
	// Rejected up front, never able to fail someone else's transaction.
	for _, c := range []struct {
		chatN int64
		body  string
	}{{0, "zero chat"}, {-1, "negative chat"}, {1, "nul\x00"}, {1, "bad \xff utf-8"}} {
		var fe *chat.FieldError
		if _, err := e.store.Send(context.Background(), c.chatN, c.body, ""); !errors.As(err, &fe) {
			t.Errorf("send(%d, %q): %v, want a *FieldError", c.chatN, c.body, err)
		}
	}
	for _, table := range []string{"messages", "outbox"} {
		if n := e.count(t, `SELECT count(*) FROM consumers.`+table); n != 0 {
			t.Errorf("%d rows in %s", n, table)
		}
	}
}

// TestSendBatchFailure: a transaction that fails (its backend is terminated)
// fails every send of its batch and stores nothing of any of them; later
// sends number on without a gap.
func TestSendBatchFailure(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t, outbox.WakeAfterCommit)
	// terminate ends the backend of the committer's transaction once it
	// waits on the table lock, and waits until it is gone.
	terminate := func() {
		t.Helper()
		ctx := context.Background()
		var pid int32
		testenv.WaitFor(t, 10*time.Second, "committer blocked on the chat lock", func() bool {
			err := e.h.Admin.QueryRow(ctx, `SELECT pid FROM pg_stat_activity
				WHERE datname = current_database() AND usename = 'consumers' AND wait_event_type = 'Lock'`).Scan(&pid)
			return err == nil
		})
		if _, err := e.h.Admin.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 10*time.Second, "terminated backend gone", func() bool {
			return e.count(t, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid) == 0
		})
	}
	release := e.blockCommitter(t)
	first := e.goSend(context.Background(), 1, "first")
	e.waitBlocked(t)
	var batch []<-chan sendOutcome
	for i := range 5 {
		batch = append(batch, e.goSend(context.Background(), int64(1+i%3), fmt.Sprint("b", i)))
		e.waitQueued(t, i+1)
	}
	terminate() // the first batch
	if o := <-first; o.err == nil {
		t.Fatalf("first send succeeded on a terminated backend: %+v", o.m)
	}
	terminate() // the second: all five
	for i, ch := range batch {
		if o := <-ch; o.err == nil {
			t.Errorf("send %d succeeded in a failed batch: %+v", i, o.m)
		}
	}
	release(false) // before counting: the lock holds back reads of messages
	for _, table := range []string{"messages", "outbox"} {
		if n := e.count(t, `SELECT count(*) FROM consumers.`+table); n != 0 {
			t.Errorf("%d rows in %s after failed batches", n, table)
		}
	}
	for chatN := int64(1); chatN <= 3; chatN++ {
		m, err := e.store.Send(context.Background(), chatN, "after", "")
		if err != nil {
			t.Fatal(err)
		}
		if m.Seq != 1 {
			t.Errorf("chat %d: seq %d after failed batches, want 1", chatN, m.Seq)
		}
	}
	e.checkConsistent(t)
}

// TestSendBatchPostgresDown: with the database stopped every send fails
// (nothing queued is left waiting), and after a restart sends resume.
func TestSendBatchPostgresDown(t *testing.T) {
	t.Parallel()
	srv := testenv.PrivatePostgres(t)
	ctx := context.Background()
	admin, err := pgxpool.New(ctx, srv.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if err := schema.Bootstrap(ctx, admin, chat.Consumers); err != nil {
		t.Fatal(err)
	}
	if _, err := schema.Migrate(ctx, admin, chat.Consumers); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, srv.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	w, err := outbox.NewWriter(nil, &outbox.WriterConfig{Table: "consumers.outbox", Mode: outbox.WakeNone})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(pool, &Config{Service: chat.Consumers, Writer: w})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Stop(ctx)
	if _, err := s.Send(ctx, 1, "before", ""); err != nil {
		t.Fatal(err)
	}
	if err := srv.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			if m, err := s.Send(ctx, int64(1+i%4), "while down", ""); err == nil {
				t.Errorf("send succeeded with postgres down: %+v", m)
			}
		})
	}
	wg.Wait()
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	admin.Reset() // its connections died with the server
	testenv.WaitFor(t, 20*time.Second, "a send after the restart", func() bool {
		m, err := s.Send(ctx, 1, "after", "")
		if err == nil && m.Seq != 2 {
			t.Fatalf("seq %d after the restart, want 2", m.Seq)
		}
		return err == nil
	})
	var n int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM consumers.messages`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("%d messages stored, want 2", n)
	}
}

func TestStoreLifecycle(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t, outbox.WakeAfterCommit)
	ctx := context.Background()
	if err := e.store.Start(ctx); !errors.Is(err, outbox.ErrAlreadyStarted) {
		t.Fatalf("second Start: %v, want ErrAlreadyStarted", err)
	}

	// Stop commits what is queued, then returns; sends meanwhile run alone
	// (not queued: the queue keeps its one send while "alone" waits too).
	release := e.blockCommitter(t)
	first := e.goSend(ctx, 1, "first")
	e.waitBlocked(t)
	second := e.goSend(ctx, 1, "second")
	e.waitQueued(t, 1)
	stopped := make(chan error, 1)
	go func() { stopped <- e.store.Stop(ctx) }()
	testenv.WaitFor(t, 10*time.Second, "stopping", func() bool {
		e.store.mu.Lock()
		defer e.store.mu.Unlock()
		return e.store.run.stopping
	})
	alone := e.goSend(ctx, 2, "alone")
	testenv.WaitFor(t, 10*time.Second, "the lone send waiting on the table lock too", func() bool {
		return e.count(t, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND usename = 'consumers' AND wait_event_type = 'Lock'`) == 2
	})
	e.waitQueued(t, 1)
	release(true)
	for i, ch := range []<-chan sendOutcome{first, second} {
		if o := <-ch; o.err != nil || o.m.Seq != int64(i+1) {
			t.Fatalf("queued send %d: %+v", i, o)
		}
	}
	if o := <-alone; o.err != nil || o.m.Seq != 1 {
		t.Fatalf("send while stopping: %+v", o)
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if err := e.store.Stop(ctx); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if m, err := e.store.Send(ctx, 1, "stopped", ""); err != nil || m.Seq != 3 {
		t.Fatalf("send after Stop: %+v, %v", m, err)
	}

	// Restart; a Stop whose ctx is done aborts the queued and in-flight
	// sends, and stores nothing of theirs.
	if err := e.store.Start(ctx); err != nil {
		t.Fatal(err)
	}
	release = e.blockCommitter(t)
	inflight := e.goSend(ctx, 3, "in flight")
	e.waitBlocked(t)
	queued := e.goSend(ctx, 4, "queued")
	e.waitQueued(t, 1)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := e.store.Stop(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Stop with a done ctx: %v, want context.Canceled", err)
	}
	for _, ch := range []<-chan sendOutcome{inflight, queued} {
		if o := <-ch; o.err == nil {
			t.Fatalf("aborted send succeeded: %+v", o.m)
		}
	}
	release(false)
	if n := e.count(t, `SELECT count(*) FROM consumers.messages WHERE chat_id IN (3, 4)`); n != 0 {
		t.Fatalf("%d aborted messages stored", n)
	}

	// The Start ctx ending is a hard stop (internal/service): the
	// committer exits, and later sends run alone.
	sctx, scancel := context.WithCancel(ctx)
	if err := e.store.Start(sctx); err != nil {
		t.Fatal(err)
	}
	scancel()
	select {
	case <-e.store.Stopped():
	case <-time.After(10 * time.Second):
		t.Fatal("not stopped 10 s after the Start ctx ended")
	}
	if m, err := e.store.Send(ctx, 5, "alone after a hard stop", ""); err != nil || m.Seq != 1 {
		t.Fatalf("send after a hard stop: %+v, %v", m, err)
	}
	if err := e.store.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.store.Start(ctx); err != nil { // the cleanup stops it
		t.Fatal(err)
	}
	e.checkConsistent(t)
}

// ExampleStore_Start group-commits concurrent sends. It needs a Postgres
// with the consumers schema (DATABASE_URL), so it has no Output.
func ExampleStore_Start() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	w, err := outbox.NewWriter(pool, &outbox.WriterConfig{Table: "consumers.outbox"})
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = w.Start(ctx)
	defer w.Stop(ctx)
	store, err := New(pool, &Config{Service: chat.Consumers, Writer: w})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := store.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer store.Stop(ctx) // commits what is queued, then returns
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Go(func() {
			m, err := store.Send(ctx, 42, fmt.Sprint("hello ", i), "")
			if err != nil {
				fmt.Println(err) // nothing of this send was stored
				return
			}
			fmt.Println(m.ChatID, m.Seq)
		})
	}
	wg.Wait()
}
