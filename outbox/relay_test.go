package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/outbox"
)

func TestEnqueueCommitPublishedOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w, rec, r := setupRelay(t, outbox.WakeNone, outbox.RelayConfig{})

	enqueue(t, pool, w, ev("a"), ev("b"), ev("c")) // multi-row insert
	enqueue(t, pool, w, outbox.Event{ID: "d", Name: "other", Payload: []byte(`{"n": [1, 2], "s": "x"}`)})

	n, err := r.RunOnce(ctx)
	if err != nil || n != 4 {
		t.Fatalf("RunOnce = %d, %v; want 4, nil", n, err)
	}
	if got := rec.ids(); !slices.Equal(got, []string{"a", "b", "c", "d"}) {
		t.Fatalf("published %v, want [a b c d] in enqueue order", got)
	}
	d := rec.all[3]
	if d.Event != "other" || !jsonEqual(d.Payload, []byte(`{"s":"x","n":[1,2]}`)) || d.RowID <= rec.all[2].RowID || d.CreatedAt.IsZero() {
		t.Errorf("message d = %+v (payload %s)", d, d.Payload)
	}
	// Published rows are deleted.
	if left := rows(t, pool); len(left) != 0 {
		t.Errorf("rows left after publishing: %+v", left)
	}
	if n, err := r.RunOnce(ctx); err != nil || n != 0 {
		t.Fatalf("second RunOnce = %d, %v; want 0, nil", n, err)
	}
	if got := len(rec.ids()); got != 4 {
		t.Fatalf("published %d messages in total, want 4", got)
	}
}

func TestRollbackPublishesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w, rec, r := setupRelay(t, outbox.WakeInTx, outbox.RelayConfig{})

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Enqueue(ctx, tx, ev("x"), ev("y")); err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := r.RunOnce(ctx); err != nil || n != 0 {
		t.Fatalf("RunOnce = %d, %v; want 0, nil", n, err)
	}
	if len(rows(t, pool)) != 0 || len(rec.ids()) != 0 {
		t.Fatal("rolled back events were stored or published")
	}
}

func TestEnqueueInvalidEventLeavesTxUsable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w := setupWriter(t, outbox.WakeInTx)
	bad := []outbox.Event{
		{Name: "n", Payload: []byte(`{}`)},
		{ID: "i", Payload: []byte(`{}`)},
		{ID: "i", Name: "n"},
		{ID: "i", Name: "n", Payload: []byte(`{"a":`)},
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for i, e := range bad {
			err := w.Enqueue(ctx, tx, ev("ok1"), e)
			if !errors.Is(err, outbox.ErrInvalidEvent) || !strings.HasPrefix(err.Error(), "outbox: enqueue: ") {
				t.Errorf("bad event %d: err = %v, want outbox: enqueue: ... ErrInvalidEvent", i, err)
			}
		}
		if err := w.Enqueue(ctx, tx); err != nil {
			t.Errorf("enqueue of nothing: %v", err)
		}
		return w.Enqueue(ctx, tx, ev("ok2"))
	})
	if err != nil {
		t.Fatalf("tx after invalid events: %v", err)
	}
	if got := rows(t, pool); len(got) != 1 || got[0].id != "ok2" {
		t.Fatalf("rows = %+v, want only ok2", got)
	}
}

func TestPublisherErrorRowsStayUnsent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w := setupWriter(t, outbox.WakeNone)
	brokerDown := errors.New("broker down")
	rec := &recorder{hook: func(_ context.Context, call int, _ []outbox.Message) error {
		if call <= 2 {
			return brokerDown
		}
		return nil
	}}
	var failedStages []string
	var mu sync.Mutex
	r := newRelay(t, pool, outbox.RelayConfig{Publisher: rec, OnEvent: func(e outbox.RelayEvent) {
		if e.Kind == outbox.EventPassFailed {
			mu.Lock()
			failedStages = append(failedStages, e.Stage)
			mu.Unlock()
		}
	}})
	enqueue(t, pool, w, ev("p1"), ev("p2"))

	for attempt := 1; attempt <= 2; attempt++ {
		n, err := r.RunOnce(ctx)
		if !errors.Is(err, brokerDown) || n != 0 {
			t.Fatalf("pass %d: RunOnce = %d, %v; want 0, broker down", attempt, n, err)
		}
		for _, row := range rows(t, pool) {
			if row.sent || row.attempts != attempt || row.lastError == nil || !strings.Contains(*row.lastError, "broker down") {
				t.Fatalf("pass %d: row %+v, want unsent with attempts %d and last_error", attempt, row, attempt)
			}
		}
	}
	if n, err := r.RunOnce(ctx); err != nil || n != 2 {
		t.Fatalf("pass 3: RunOnce = %d, %v; want 2, nil", n, err)
	}
	if got := rec.ids(); !slices.Equal(got, []string{"p1", "p2"}) {
		t.Fatalf("published %v, want [p1 p2]", got)
	}
	if unsent(t, pool) != 0 {
		t.Fatal("rows unsent after a successful pass")
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(failedStages, []string{"publish", "publish"}) {
		t.Errorf("Failed stages = %v, want [publish publish]", failedStages)
	}
}

// terminateRelayBackend kills the session that holds the claim transaction
// open (it is idle in transaction while Publish runs) and waits for it to go.
func terminateRelayBackend(ctx context.Context, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) error {
	var ok bool
	err := pool.QueryRow(ctx, `SELECT coalesce(bool_and(pg_terminate_backend(pid, 5000)), false)
		FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()
		  AND state = 'idle in transaction' AND query LIKE 'SELECT id, idempotency_key%'`).Scan(&ok)
	if err != nil {
		return err
	}
	if !ok {
		return errors.New("no relay backend found")
	}
	return nil
}

func TestCrashBetweenPublishAndCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w := setupWriter(t, outbox.WakeNone)
	other := newPool(t, pool, 2)
	rec := &recorder{}
	// The first relay publishes (the broker records), then "crashes": its
	// session dies before mark-sent and COMMIT.
	first := newRelay(t, pool, outbox.RelayConfig{Publisher: outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) error {
		if err := rec.Publish(ctx, msgs); err != nil {
			return err
		}
		if err := terminateRelayBackend(ctx, other); err != nil {
			return fmt.Errorf("terminate: %w", err)
		}
		return nil
	})})
	enqueue(t, pool, w, ev("c1"), ev("c2"), ev("c3"))

	n, err := first.RunOnce(ctx)
	if err == nil || n != 0 || strings.Contains(err.Error(), "terminate:") {
		t.Fatalf("crashing RunOnce = %d, %v; want 0 and a mark-sent error", n, err)
	}
	if unsent(t, pool) != 3 {
		t.Fatal("rows marked sent although the relay died before COMMIT")
	}
	restarted := newRelay(t, pool, outbox.RelayConfig{Publisher: rec})
	if n, err := restarted.RunOnce(ctx); err != nil || n != 3 {
		t.Fatalf("restarted RunOnce = %d, %v; want 3, nil", n, err)
	}
	if got := rec.ids(); !slices.Equal(got, []string{"c1", "c2", "c3", "c1", "c2", "c3"}) {
		t.Fatalf("broker log %v, want each ID published twice", got)
	}
	if got := rec.distinct(); !slices.Equal(got, []string{"c1", "c2", "c3"}) {
		t.Fatalf("after dedupe by ID %v, want [c1 c2 c3]", got)
	}
	// Published (and so deleted) after one failed attempt.
	if left := rows(t, pool); len(left) != 0 {
		t.Errorf("rows left after publishing: %+v", left)
	}
}

// TestNotifyWakeUp proves LISTEN/NOTIFY works in both wake modes: the poll
// interval is an hour, and besides notifications only the start and the
// LISTEN (re)connect trigger passes (two at most), so of three events
// enqueued one after another at least one is published by a notification.
func TestNotifyWakeUp(t *testing.T) {
	t.Parallel()
	for _, mode := range []outbox.WakeMode{outbox.WakeAfterCommit, outbox.WakeInTx} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			pool, w, rec, r := setupRelay(t, mode, outbox.RelayConfig{PollInterval: time.Hour})
			startRelay(t, r)
			testenv.WaitFor(t, 5*time.Second, "relay listening", r.Listening)
			for i := range 3 {
				id := "n" + strconv.Itoa(i)
				enqueue(t, pool, w, ev(id))
				testenv.WaitFor(t, 2*time.Second, "published "+id, func() bool { return rec.has(id) })
			}
		})
	}
}

func listenPID(t testing.TB, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) int {
	var pid int
	err := pool.QueryRow(context.Background(), `SELECT coalesce(max(pid), 0) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = $1 AND query LIKE 'LISTEN%'`,
		outbox.DefaultListenApplicationName).Scan(&pid)
	if err != nil {
		t.Fatalf("find listen backend: %v", err)
	}
	return pid
}

func TestListenConnectionKilled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w := setupWriter(t, outbox.WakeAfterCommit)
	rec := &recorder{}
	var ups, downs int
	byTrigger := map[outbox.WakeTrigger]int{} // rows published
	var mu sync.Mutex
	r := newRelay(t, pool, outbox.RelayConfig{Publisher: rec, PollInterval: time.Hour, OnEvent: func(e outbox.RelayEvent) {
		mu.Lock()
		defer mu.Unlock()
		switch e.Kind {
		case outbox.EventListenUp:
			ups++
		case outbox.EventListenDown:
			downs++
		case outbox.EventPublished:
			byTrigger[e.Trigger] += e.N
		}
	}})
	startRelay(t, r)
	var pid int
	// Listening, not only connected: a backend killed before it listened
	// would be lost before its first up event.
	testenv.WaitFor(t, 5*time.Second, "listen backend", func() bool {
		pid = listenPID(t, pool)
		return pid != 0 && r.Listening()
	})

	if _, err := pool.Exec(ctx, "SELECT pg_terminate_backend($1, 5000)", pid); err != nil {
		t.Fatalf("terminate listen backend: %v", err)
	}
	// Committed while the listener is down or reconnecting: its notification
	// may be lost; the reconnect's catch-up pass publishes it.
	enqueue(t, pool, w, ev("during"))
	testenv.WaitFor(t, 5*time.Second, "published during outage", func() bool { return rec.has("during") })
	testenv.WaitFor(t, 5*time.Second, "new listen backend", func() bool {
		p := listenPID(t, pool)
		return p != 0 && p != pid && r.Listening()
	})
	// Back on NOTIFY: every row enqueued from now on is published by a pass
	// a notification started (the poll is an hour; the catch-up's pass has
	// run, since it published "during" or found it gone).
	// The publisher sees a row before the relay reports its pass, so the
	// counts are read once they add up to the rows the recorder saw.
	published := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, c := range byTrigger {
			n += c
		}
		return n
	}
	testenv.WaitFor(t, 2*time.Second, "the outage row's pass reported", func() bool { return published() >= 1 })
	mu.Lock()
	before := maps.Clone(byTrigger)
	mu.Unlock()
	for i := range 3 {
		id := "after" + strconv.Itoa(i)
		enqueue(t, pool, w, ev(id))
		testenv.WaitFor(t, 2*time.Second, "published "+id, func() bool { return rec.has(id) })
	}
	testenv.WaitFor(t, 2*time.Second, "the three rows' passes reported", func() bool { return published() >= 4 })
	mu.Lock()
	defer mu.Unlock()
	if ups < 2 || downs < 1 {
		t.Errorf("listen events: %d ups, %d downs; want ≥2 and ≥1", ups, downs)
	}
	if got := byTrigger[outbox.TriggerNotify] - before[outbox.TriggerNotify]; got != 3 {
		t.Errorf("rows published by a NOTIFY after the reconnect = %d, want 3 (by trigger before %v, after %v)", got, before, byTrigger)
	}
}

func TestPollOnly(t *testing.T) {
	t.Parallel()
	pool, w, rec, r := setupRelay(t, outbox.WakeNone, outbox.RelayConfig{DisableListen: true, PollInterval: 20 * time.Millisecond})
	startRelay(t, r)
	for i := range 3 {
		id := "poll" + strconv.Itoa(i)
		enqueue(t, pool, w, ev(id))
		testenv.WaitFor(t, 5*time.Second, "published "+id, func() bool { return rec.has(id) })
	}
	if r.Listening() {
		t.Error("Listening() = true with DisableListen")
	}
	if listenPID(t, pool) != 0 {
		t.Error("a LISTEN connection exists with DisableListen")
	}
}

// TestTwoRelaysOrder runs a rolling-deploy overlap: two relays (own pools, as
// two processes) on one table while 20 writers enqueue 50 events each across
// 5 chats, each event numbered by the chat's counter row locked in its
// transaction. Every ID must be published, and each chat's first
// publications must come in seq order.
func TestTwoRelaysOrder(t *testing.T) {
	t.Parallel()
	const writers, perWriter, chats = 20, 50, 5
	pool := setup(t)
	wpool := newPool(t, pool, 8)
	w := newWriter(t, wpool, outbox.WakeAfterCommit)
	rec := &recorder{}
	for i := range 2 {
		// Small batches make the relays interleave often.
		r := newRelay(t, newPool(t, pool, 2), outbox.RelayConfig{Publisher: rec, BatchSize: 7 + i})
		startRelay(t, r)
	}
	writeChats(t, wpool, writers, perWriter, chats, func(int) *outbox.Writer { return w })
	checkChatOrder(t, rec, writers*perWriter, chats)
	if n := unsent(t, pool); n != 0 {
		t.Fatalf("%d rows unsent", n)
	}
	t.Logf("%d publications for %d IDs", len(rec.ids()), writers*perWriter)
}

// writeChats has writers goroutines each commit perWriter events on pool,
// one per transaction, over chats chats (table ob.chats, created here,
// hands out each chat's seq under its row lock, so that transactions
// commit out of id order), each event through writerOf(chat) and its id
// "<chat>/<seq>"; it calls Committed after each commit.
func writeChats(t *testing.T, pool *pgxpool.Pool, writers, perWriter, chats int, writerOf func(chat int) *outbox.Writer) {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE ob.chats (chat_id int PRIMARY KEY, last_seq int NOT NULL);
		INSERT INTO ob.chats SELECT g, 0 FROM generate_series(0, %d) g`, chats-1)); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for g := range writers {
		wg.Go(func() {
			for i := range perWriter {
				chat := (g + i) % chats
				w := writerOf(chat)
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					var seq int
					if err := tx.QueryRow(ctx, "UPDATE ob.chats SET last_seq = last_seq + 1 WHERE chat_id = $1 RETURNING last_seq",
						chat).Scan(&seq); err != nil {
						return err
					}
					id := fmt.Sprintf("%d/%d", chat, seq)
					return w.Enqueue(ctx, tx, outbox.Event{ID: id, Name: "msg", Payload: []byte(fmt.Sprintf(`{"chat":%d,"seq":%d}`, chat, seq))})
				})
				if err != nil {
					errs <- err
					return
				}
				w.Committed()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("writer: %v", err)
	}
}

// checkChatOrder waits until rec has published n distinct events of
// writeChats, then checks that each chat's first publications came in seq
// order.
func checkChatOrder(t *testing.T, rec *recorder, n, chats int) {
	t.Helper()
	testenv.WaitFor(t, 30*time.Second, "all events published", func() bool {
		return len(rec.distinct()) == n
	})
	next := make([]int, chats)
	for _, id := range rec.distinct() {
		var chat, seq int
		if _, err := fmt.Sscanf(id, "%d/%d", &chat, &seq); err != nil {
			t.Fatalf("bad id %q", id)
		}
		next[chat]++
		if seq != next[chat] {
			t.Fatalf("chat %d: first publication of seq %d came where seq %d was due", chat, seq, next[chat])
		}
	}
}

func TestLockTimeoutBoundsClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w, _, r := setupRelay(t, outbox.WakeNone, outbox.RelayConfig{LockTimeout: 100 * time.Millisecond})
	enqueue(t, pool, w, ev("l1"))

	foreign, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer foreign.Rollback(ctx)
	if _, err := foreign.Exec(ctx, "SELECT id FROM ob.outbox FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	n, err := r.RunOnce(ctx)
	elapsed := time.Since(start)
	var pgErr *pgconn.PgError
	if n != 0 || !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Fatalf("blocked RunOnce = %d, %v; want 0, lock_not_available (55P03)", n, err)
	}
	// Generous bound: the point is "returns", not how fast.
	if elapsed > 5*time.Second {
		t.Fatalf("blocked RunOnce took %v with a 100ms lock timeout", elapsed)
	}
	if err := foreign.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if got := rows(t, pool); len(got) != 1 || got[0].attempts != 0 {
		t.Errorf("rows %+v; want one with 0 attempts: a failed claim has no rows to record", got)
	}
	if n, err := r.RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("RunOnce after release = %d, %v; want 1, nil", n, err)
	}
}

// TestRelayTimeoutsAreTransactionLocal checks that the pool's sessions keep
// their defaults after relay passes.
func TestRelayTimeoutsAreTransactionLocal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t, setup(t), 1) // one connection: the relay's
	w := newWriter(t, pool, outbox.WakeNone)
	var inTx string
	r := newRelay(t, pool, outbox.RelayConfig{Publisher: outbox.PublisherFunc(func(context.Context, []outbox.Message) error { return nil }),
		LockTimeout: 1234 * time.Millisecond})
	enqueue(t, pool, w, ev("t1"))
	if _, err := r.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, "SELECT current_setting('lock_timeout')").Scan(&inTx); err != nil {
		t.Fatal(err)
	}
	if inTx != "0" {
		t.Errorf("session lock_timeout after a pass = %q, want the default 0", inTx)
	}
}

func TestStopFinishesInflightPass(t *testing.T) {
	t.Parallel()
	pool, w := setupWriter(t, outbox.WakeNone)
	entered := make(chan struct{})
	release := make(chan struct{})
	r := newRelay(t, pool, outbox.RelayConfig{Publisher: outbox.PublisherFunc(func(ctx context.Context, _ []outbox.Message) error {
		close(entered)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}), PollInterval: time.Hour})
	enqueue(t, pool, w, ev("s1"))
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); !errors.Is(err, outbox.ErrAlreadyStarted) {
		t.Errorf("second Start: %v, want ErrAlreadyStarted", err)
	}
	<-entered
	stopped := make(chan error, 1)
	go func() { stopped <- r.Stop(context.Background()) }()
	close(release)
	if err := <-stopped; err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := r.Stop(context.Background()); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if unsent(t, pool) != 0 {
		t.Fatal("in-flight pass was not finished by Stop")
	}
}

func TestStopDeadlineCancelsInflightPass(t *testing.T) {
	t.Parallel()
	pool, w := setupWriter(t, outbox.WakeNone)
	entered := make(chan struct{})
	r := newRelay(t, pool, outbox.RelayConfig{Publisher: outbox.PublisherFunc(func(ctx context.Context, _ []outbox.Message) error {
		close(entered)
		<-ctx.Done() // a stuck broker
		return ctx.Err()
	}), PollInterval: time.Hour, PublishTimeout: time.Hour})
	enqueue(t, pool, w, ev("h1"))
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-entered
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Stop(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Stop(cancelled ctx) = %v, want context.Canceled", err)
	}
	got := rows(t, pool)
	if got[0].sent || got[0].attempts != 1 {
		t.Fatalf("row %+v: want unsent with the cancelled attempt recorded", got[0])
	}
	// A stopped relay can start again and finish the job.
	rec := &recorder{}
	r2 := newRelay(t, pool, outbox.RelayConfig{Publisher: rec})
	startRelay(t, r2)
	testenv.WaitFor(t, 5*time.Second, "published after restart", func() bool { return rec.has("h1") })
}

func TestLastErrorIsTruncatedValidText(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w := setupWriter(t, outbox.WakeNone)
	long := errors.New("x\x00" + strings.Repeat("é", 2000)) // odd byte offset: truncation splits a rune
	r := newRelay(t, pool, outbox.RelayConfig{Publisher: outbox.PublisherFunc(func(context.Context, []outbox.Message) error { return long })})
	enqueue(t, pool, w, ev("e1"))
	if _, err := r.RunOnce(ctx); !errors.Is(err, long) {
		t.Fatalf("RunOnce: %v, want the publish error", err)
	}
	got := rows(t, pool)[0]
	if got.attempts != 1 || got.lastError == nil || len(*got.lastError) > 1000 || !strings.HasSuffix(*got.lastError, "é") {
		t.Fatalf("row %+v: want attempts 1 and last_error cut to ≤1000 bytes of valid text", got)
	}
}

// NotifyInterval spaces the post-commit notifies: the first Committed after
// a quiet spell notifies at once, a burst within the interval becomes one
// notify at its end, and nothing more follows.
func TestNotifyInterval(t *testing.T) {
	t.Parallel()
	const interval = 300 * time.Millisecond
	pool := setup(t)
	ctx := context.Background()
	w, err := outbox.NewWriter(pool, &outbox.WriterConfig{Table: testTable, NotifyInterval: interval})
	if err != nil {
		t.Fatal(err)
	}
	next := listen(t, pool, w.Channel())
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	wait := func(d time.Duration) (time.Time, bool) {
		_, ok := next(d)
		return time.Now(), ok
	}
	start := time.Now()
	w.Committed()
	first, ok := wait(5 * time.Second)
	if !ok {
		t.Fatal("no notification for the first Committed")
	}
	if d := first.Sub(start); d >= interval {
		t.Fatalf("first notification after %v: a quiet Writer must notify at once", d)
	}
	for range 20 {
		w.Committed()
	}
	second, ok := wait(5 * time.Second)
	if !ok {
		t.Fatal("no notification for the burst")
	}
	// Measured from the first Committed, not from when the first
	// notification was read: on a loaded machine that read can be late,
	// while the Writer's spacing runs from when it sent the first.
	if d := second.Sub(start); d < interval-50*time.Millisecond {
		t.Fatalf("second notification %v after the first Committed, want at least about %v", d, interval)
	}
	if _, ok := wait(2 * interval); ok {
		t.Fatal("a third notification: the burst of 20 must be one")
	}
}

// IgnoreNotification drops the notifications of the backends it names: a
// row whose NOTIFY came from an ignored backend waits for a Wake (or the
// poll), while another backend's NOTIFY still wakes the relay.
func TestIgnoreNotification(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w := setupWriter(t, outbox.WakeInTx)
	own, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = own.Close(context.Background()) })
	ownPID := own.PgConn().PID()
	rec := &recorder{}
	r := newRelay(t, pool, outbox.RelayConfig{Publisher: rec, PollInterval: time.Hour,
		IgnoreNotification: func(pid uint32) bool { return pid == ownPID }})
	startRelay(t, r)
	testenv.WaitFor(t, 5*time.Second, "relay listening", r.Listening)
	// The start and the LISTEN connect each wake the relay for a pass; a
	// row published through a NOTIFY that is not ignored, after both,
	// shows those passes have run (on a busy machine they could otherwise
	// still be pending when the ignored row commits, and publish it).
	enqueue(t, pool, w, ev("warm-up"))
	testenv.WaitFor(t, 5*time.Second, "warm-up published", func() bool { return rec.has("warm-up") && unsent(t, pool) == 0 })

	tx, err := own.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Enqueue(ctx, tx, ev("ignored")); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// Nothing else wakes the relay: the row waits (the relay would
	// publish it within milliseconds had the NOTIFY not been dropped).
	time.Sleep(500 * time.Millisecond)
	if n := unsent(t, pool); n != 1 || rec.has("ignored") {
		t.Fatalf("after an ignored NOTIFY: %d unsent, published %v; want the row left for a Wake", n, rec.ids())
	}
	r.Wake()
	testenv.WaitFor(t, 5*time.Second, "published after Wake", func() bool { return rec.has("ignored") })
	enqueue(t, pool, w, ev("heard")) // another backend: its NOTIFY wakes the relay
	testenv.WaitFor(t, 5*time.Second, "published heard", func() bool { return rec.has("heard") })
}

// TestRelayEvents: a pass reports claimed and published with the row
// count, a failed one pass_failed with its stage and error.
func TestRelayEvents(t *testing.T) {
	t.Parallel()
	pool, w := setupWriter(t, outbox.WakeNone)
	var mu sync.Mutex
	var got []outbox.RelayEvent
	fail := errors.New("broker down")
	var failing bool
	r := newRelay(t, pool, outbox.RelayConfig{
		Publisher: outbox.PublisherFunc(func(context.Context, []outbox.Message) error {
			mu.Lock()
			defer mu.Unlock()
			if failing {
				return fail
			}
			return nil
		}),
		OnEvent: func(e outbox.RelayEvent) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, e)
		},
	})
	enqueue(t, pool, w, ev("e1"), ev("e2"))
	if n, err := r.RunOnce(context.Background()); err != nil || n != 2 {
		t.Fatalf("RunOnce = %d, %v", n, err)
	}
	mu.Lock()
	if len(got) != 2 || got[0].Kind != outbox.EventClaimed || got[0].N != 2 ||
		got[1].Kind != outbox.EventPublished || got[1].N != 2 || got[1].Duration <= 0 {
		t.Fatalf("events of a published pass: %+v", got)
	}
	got, failing = nil, true
	mu.Unlock()
	enqueue(t, pool, w, ev("e3"))
	if _, err := r.RunOnce(context.Background()); !errors.Is(err, fail) {
		t.Fatalf("RunOnce with a failing publisher = %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 || got[1].Kind != outbox.EventPassFailed || got[1].Stage != "publish" || !errors.Is(got[1].Err, fail) {
		t.Fatalf("events of a failed pass: %+v", got)
	}
}

// TestClaimFloorWaitsForOpenTransactions: a row whose transaction took its
// id before others but commits after they were published is still
// published: the claim floor (internal/claimfloor) never passes an id a running
// transaction may still commit. A relay that simply claimed after the last
// id it published would skip it for good.
func TestClaimFloorWaitsForOpenTransactions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w, rec, r := setupRelay(t, outbox.WakeNone, outbox.RelayConfig{})
	if n, err := r.RunOnce(ctx); err != nil || n != 0 {
		t.Fatalf("first RunOnce = %d, %v", n, err)
	}
	slow, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Rollback(ctx)
	if err := w.Enqueue(ctx, slow, ev("late")); err != nil { // takes the lower id
		t.Fatal(err)
	}
	for i := range 3 {
		enqueue(t, pool, w, ev(fmt.Sprint("early", i)))
		// Passes while "late" is still open: each publishes what is
		// committed and moves the floor as far as it safely can.
		for range 2 {
			if _, err := r.RunOnce(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := rec.ids(); !slices.Equal(got, []string{"early0", "early1", "early2"}) {
		t.Fatalf("published %v while late was open", got)
	}
	if err := slow.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := r.RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("RunOnce after the late commit = %d, %v; want 1 (the late row)", n, err)
	}
	enqueue(t, pool, w, ev("after"))
	for range 2 {
		if _, err := r.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := rec.ids(); !slices.Equal(got, []string{"early0", "early1", "early2", "late", "after"}) {
		t.Fatalf("published %v", got)
	}
	if left := rows(t, pool); len(left) != 0 {
		t.Fatalf("rows left: %+v", left)
	}
}

// A transaction that took its outbox id and is the newest one running (no
// transaction with a higher xid has ended, so it is at or above the
// snapshots' xmax and not in their xip lists) commits after the relay's
// passes: the floor must not move past its id, so the first pass after its
// commit publishes it, not the 10 s full-scan safety net. Not parallel: a
// commit by another test (the server is shared) would raise xmax above the
// open transaction's xid and hide the case.
func TestClaimFloorWaitsForNewestOpenTransaction(t *testing.T) {
	ctx := context.Background()
	pool, w, rec, r := setupRelay(t, outbox.WakeNone, outbox.RelayConfig{})
	enqueue(t, pool, w, ev("first"))
	if n, err := r.RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("first RunOnce = %d, %v", n, err)
	}
	late, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Rollback(ctx)
	if err := w.Enqueue(ctx, late, ev("late")); err != nil {
		t.Fatal(err)
	}
	// Passes while "late" is open and nothing newer commits.
	for range 3 {
		if n, err := r.RunOnce(ctx); err != nil || n != 0 {
			t.Fatalf("RunOnce while late is open = %d, %v; want 0", n, err)
		}
	}
	if err := late.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := r.RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("RunOnce after the late commit = %d, %v; want 1: the floor moved past the open transaction's row, which now waits for the full scan", n, err)
	}
	if got := rec.ids(); !slices.Equal(got, []string{"first", "late"}) {
		t.Fatalf("published %v", got)
	}
}

// TestClaimFloorOlderTransactionEndsFirst: a snapshot's xmax is the latest
// completed xid + 1, not the next xid to be assigned, so a transaction that
// took its xid and its outbox id before a pass read them can have an xid
// at or above that pass's xmax. When an older transaction then ends first,
// a later pass's xmin passes the xmax while the row's transaction is still
// open; the floor must not move past the row. On a private server, so that
// no other test's commits move the latest completed xid.
func TestClaimFloorOlderTransactionEndsFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := testenv.PrivatePostgres(t)
	pool, err := pgxpool.New(ctx, srv.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, "CREATE SCHEMA ob;\n"+outbox.TableDDL(testTable)); err != nil {
		t.Fatal(err)
	}
	w := newWriter(t, pool, outbox.WakeNone)
	rec := &recorder{}
	r := newRelay(t, pool, outbox.RelayConfig{Publisher: rec})
	if _, err := r.RunOnce(ctx); err != nil { // the first pass scans from 0
		t.Fatal(err)
	}
	older, err := pool.Begin(ctx) // an unrelated writer: an xid, no outbox row
	if err != nil {
		t.Fatal(err)
	}
	defer older.Rollback(ctx)
	if _, err := older.Exec(ctx, "SELECT pg_current_xact_id()"); err != nil {
		t.Fatal(err)
	}
	slow, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Rollback(ctx)
	if err := w.Enqueue(ctx, slow, ev("slow")); err != nil { // a newer xid, id 1
		t.Fatal(err)
	}
	if _, err := r.RunOnce(ctx); err != nil { // reads V = 1 and a snapshot's xmax
		t.Fatal(err)
	}
	if err := older.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 { // xmin is now slow's xid: past that xmax
		if _, err := r.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := slow.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := r.RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("RunOnce after the slow commit = %d, %v; want 1 (the floor passed the open row)", n, err)
	}
	if got := rec.ids(); !slices.Equal(got, []string{"slow"}) {
		t.Fatalf("published %v", got)
	}
}
