package inbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/redisq"
)

// lockingHandler is pipeHandler whose batches first wait for an advisory
// lock the test holds: the transaction that carries one stays in flight
// until the test lets it go.
type lockingHandler struct {
	pipeHandler
	key int64
}

func (h lockingHandler) QueueBatch(b *pgx.Batch, ds []inbox.Delivery, rs []inbox.BatchResult) error {
	b.Queue(`SELECT pg_advisory_xact_lock($1)`, h.key)
	return h.pipeHandler.QueueBatch(b, ds, rs)
}

// holdLock takes the session advisory lock key on a connection of its own
// and returns its release.
func holdLock(t *testing.T, pool *pgxpool.Pool, key int64) (release func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatalf("acquiring a connection: %v", err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, key); err != nil {
		t.Fatalf("taking the advisory lock: %v", err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			if _, err := conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, key); err != nil {
				t.Errorf("releasing the advisory lock: %v", err)
			}
			conn.Release()
		})
	}
	t.Cleanup(release)
	return release
}

// orderLog records the order in which batches were queued.
type orderLog struct {
	mu    sync.Mutex
	queue []string
}

func (l *orderLog) names() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.queue)
}

// orderHandler is pipeHandler that records its name in log when it queues
// a batch.
type orderHandler struct {
	pipeHandler
	log  *orderLog
	name string
}

func (h orderHandler) QueueBatch(b *pgx.Batch, ds []inbox.Delivery, rs []inbox.BatchResult) error {
	h.log.mu.Lock()
	h.log.queue = append(h.log.queue, h.name)
	h.log.mu.Unlock()
	return h.pipeHandler.QueueBatch(b, ds, rs)
}

// groupEnv is newEnv with a Group on its pool.
func groupEnv(t *testing.T) (*env, *inbox.Group) {
	t.Helper()
	e := newEnv(t)
	g, err := inbox.NewGroup(e.pool)
	if err != nil {
		t.Fatal(err)
	}
	return e, g
}

// groupMembers returns n Consumers in one Group, member i reading as
// consumer "g<i>" with handler hs[i], and their sources.
func groupMembers(t *testing.T, e *env, g *inbox.Group, hs ...inbox.Handler) ([]*inbox.Consumer, []inbox.Source) {
	t.Helper()
	cs := make([]*inbox.Consumer, len(hs))
	srcs := make([]inbox.Source, len(hs))
	for i, h := range hs {
		srcs[i] = e.source(t, "g"+string(rune('0'+i)))
		cs[i] = e.consumer(t, srcs[i], h, &inbox.Config{Group: g})
	}
	return cs, srcs
}

// deliveries adds jobs and has src fetch them.
func deliveries(t *testing.T, e *env, src inbox.Source, jobs ...redisq.Job) []inbox.Delivery {
	t.Helper()
	e.add(t, jobs...)
	return fetchAll(t, src, len(jobs))
}

// xmins returns the transaction id that wrote each job's inbox row.
func xmins(t *testing.T, e *env, jobs ...redisq.Job) []string {
	t.Helper()
	out := make([]string, len(jobs))
	for i, j := range jobs {
		if err := e.pool.QueryRow(context.Background(),
			`SELECT xmin::text FROM t.inbox WHERE message_id = $1`, uuid.MustParse(j.ID)).Scan(&out[i]); err != nil {
			t.Fatalf("xmin of job %d: %v", i, err)
		}
	}
	return out
}

// memberRun is one member's ProcessBatch of a shared round.
type memberRun struct {
	c  *inbox.Consumer
	ds []inbox.Delivery
}

// sharedRound runs runs[0] (its handler a lockingHandler on key, whose lock
// the test holds) until its transaction waits for the lock, has the other
// runs come into g one at a time in the order given, then calls release
// and returns each run's ProcessBatch error, in the order of runs.
func sharedRound(t *testing.T, e *env, g *inbox.Group, key int64, release func(), runs ...memberRun) []error {
	t.Helper()
	ctx := context.Background()
	dones := []<-chan error{processAsync(ctx, runs[0].c, runs[0].ds)}
	waitForLockWaiter(t, e, key)
	for i, r := range runs[1:] {
		dones = append(dones, processAsync(ctx, r.c, r.ds))
		testenv.WaitFor(t, 10*time.Second, "the batch waiting in the group", func() bool { return g.Waiting() == i+1 })
	}
	if n := e.rows(t); n != 0 {
		t.Fatalf("inbox rows before the lock is released = %d, want 0", n)
	}
	release()
	errs := make([]error, len(dones))
	for i, d := range dones {
		errs[i] = wait(t, fmt.Sprint("member ", i), d)
	}
	return errs
}

// waitForLockWaiter waits until a transaction waits for the advisory lock
// key.
func waitForLockWaiter(t *testing.T, e *env, key int64) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, "a transaction to wait for the lock", func() bool {
		var n int
		_ = e.pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objid = $1`, key).Scan(&n)
		return n == 1
	})
}

// noErrors fails t for the first non-nil error of errs.
func noErrors(t *testing.T, errs []error) {
	t.Helper()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("ProcessBatch of member %d: %v", i, err)
		}
	}
}

// processAsync runs c.ProcessBatch(ds) on its own goroutine; the channel
// gets its error.
func processAsync(ctx context.Context, c *inbox.Consumer, ds []inbox.Delivery) <-chan error {
	done := make(chan error, 1)
	go func() { done <- c.ProcessBatch(ctx, ds) }()
	return done
}

func wait(t *testing.T, what string, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: no outcome after 30 s", what)
		return nil
	}
}

// Batches that arrive while a member's transaction is in flight commit
// together in the next one: one transaction id for both, every delivery
// applied once and acknowledged by its own member.
func TestGroupSharesTheNextTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, g := groupEnv(t)
	const key = 7101
	release := holdLock(t, e.pool, key)
	var order orderLog
	cs, srcs := groupMembers(t, e, g, lockingHandler{key: key}, orderHandler{log: &order, name: "b"}, orderHandler{log: &order, name: "c"})
	a := []redisq.Job{job("a1"), job("a2")}
	b := []redisq.Job{job("b1"), job("b2")}
	c := []redisq.Job{job("c1")}
	da, db, dc := deliveries(t, e, srcs[0], a...), deliveries(t, e, srcs[1], b...), deliveries(t, e, srcs[2], c...)

	// c comes in before b, which joined the group before c.
	noErrors(t, sharedRound(t, e, g, key, release, memberRun{cs[0], da}, memberRun{cs[2], dc}, memberRun{cs[1], db}))
	if got, want := g.Stats(), (inbox.GroupStats{Transactions: 2, Batches: 3}); got != want {
		t.Fatalf("group stats = %+v, want %+v", got, want)
	}
	if got := order.names(); !slices.Equal(got, []string{"b", "c"}) {
		t.Fatalf("statements queued for %v, want b's before c's (the order they joined the group)", got)
	}
	xa, xbc := xmins(t, e, a...), xmins(t, e, append(b, c...)...)
	if xa[0] != xa[1] || xbc[0] != xbc[1] || xbc[1] != xbc[2] || xa[0] == xbc[0] {
		t.Fatalf("transaction ids: a %v, b and c %v; want a in one, b and c together in another", xa, xbc)
	}
	for i, jobs := range [][]redisq.Job{a, b, c} {
		if got, want := cs[i].Stats().Applied, int64(len(jobs)); got != want {
			t.Fatalf("member %d applied %d, want %d", i, got, want)
		}
	}
	if n := e.pending(t); n != 0 {
		t.Fatalf("pending entries = %d, want 0 (each member acknowledges its own)", n)
	}
	// Idle again: the next batch commits at once, alone.
	dd := deliveries(t, e, srcs[1], job("d"))
	if err := cs[1].ProcessBatch(ctx, dd); err != nil {
		t.Fatalf("ProcessBatch after the shared transaction: %v", err)
	}
	if got := g.Stats().Transactions; got != 3 {
		t.Fatalf("transactions = %d, want 3", got)
	}
}

// A poison statement in a shared transaction aborts it: each member then
// runs its batch alone, so the poison is isolated and dead-lettered in its
// own member's batch and the other member's deliveries are applied.
func TestGroupIsolatesPoisonInASharedTransaction(t *testing.T) {
	t.Parallel()
	e, g := groupEnv(t)
	const key = 7102
	release := holdLock(t, e.pool, key)
	cs, srcs := groupMembers(t, e, g, lockingHandler{key: key}, pipeHandler{}, pipeHandler{})
	poison := rawJob(`{"id": "` + uuid.NewString() + `", "chat_id": "-7", "seq": 1, "body": "poison"}`)
	da := deliveries(t, e, srcs[0], job("a"))
	db := deliveries(t, e, srcs[1], job("b1"), poison, job("b2"))
	dc := deliveries(t, e, srcs[2], job("c1"), job("c2"))

	noErrors(t, sharedRound(t, e, g, key, release, memberRun{cs[0], da}, memberRun{cs[1], db}, memberRun{cs[2], dc}))
	if n := e.rows(t); n != 5 {
		t.Fatalf("inbox rows = %d, want 5 (every good delivery, not the poison)", n)
	}
	if got, want := cs[1].Stats(), (inbox.Stats{Applied: 2, DeadLettered: 1}); got != want {
		t.Fatalf("member b stats = %+v, want %+v", got, want)
	}
	if got, want := cs[2].Stats(), (inbox.Stats{Applied: 2}); got != want {
		t.Fatalf("member c stats = %+v, want %+v", got, want)
	}
	if n := e.deadLen(t); n != 1 {
		t.Fatalf("dead letters = %d, want 1", n)
	}
	if n := e.pending(t); n != 0 {
		t.Fatalf("pending entries = %d, want 0", n)
	}
	if recs := e.logs.records(t, "shared inbox transaction failed; running the batch alone"); len(recs) != 2 {
		t.Fatalf("log records of a member running its batch alone = %d, want 2 (b and c)", len(recs))
	}
}

// A member whose context ends while it waits leaves the Group without a
// trace of its batch, and the Group goes on: the lead passes on, and the
// member's next attempt commits.
func TestGroupMemberGivesUpWhileWaiting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, g := groupEnv(t)
	const key = 7103
	release := holdLock(t, e.pool, key)
	cs, srcs := groupMembers(t, e, g, lockingHandler{key: key}, pipeHandler{}, pipeHandler{})
	da := deliveries(t, e, srcs[0], job("a"))
	db := deliveries(t, e, srcs[1], job("b"))
	dc := deliveries(t, e, srcs[2], job("c"))

	doneA := processAsync(ctx, cs[0], da)
	waitForLockWaiter(t, e, key)
	bctx, cancel := context.WithCancel(ctx)
	doneB := processAsync(bctx, cs[1], db)
	testenv.WaitFor(t, 10*time.Second, "b waiting in the group", func() bool { return g.Waiting() == 1 })
	doneC := processAsync(ctx, cs[2], dc)
	testenv.WaitFor(t, 10*time.Second, "c waiting in the group", func() bool { return g.Waiting() == 2 })
	cancel()
	if err := wait(t, "member b", doneB); !errors.Is(err, context.Canceled) {
		t.Fatalf("ProcessBatch of member b after its context ended = %v, want context.Canceled", err)
	}
	if got := g.Waiting(); got != 1 {
		t.Fatalf("batches waiting after b gave up = %d, want 1 (c's)", got)
	}
	release()
	for name, done := range map[string]<-chan error{"a": doneA, "c": doneC} {
		if err := wait(t, "member "+name, done); err != nil {
			t.Fatalf("ProcessBatch of member %s: %v", name, err)
		}
	}
	if n := e.rows(t); n != 2 {
		t.Fatalf("inbox rows = %d, want 2 (a and c; b gave up)", n)
	}
	if err := cs[1].ProcessBatch(ctx, db); err != nil {
		t.Fatalf("member b's next attempt: %v", err)
	}
	if n, p := e.rows(t), e.pending(t); n != 3 || p != 0 {
		t.Fatalf("inbox rows = %d, pending = %d; want 3 and 0", n, p)
	}
}

// A Group made with another pool is refused.
func TestGroupOnAnotherPoolIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	other, err := pgxpool.NewWithConfig(context.Background(), e.pool.Config())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	g, err := inbox.NewGroup(other)
	if err != nil {
		t.Fatal(err)
	}
	_, err = inbox.NewConsumer(e.pool, e.source(t, "x"), pipeHandler{}, &inbox.Config{Group: g})
	if !errors.Is(err, inbox.ErrInvalidConfig) {
		t.Fatalf("NewConsumer with a Group of another pool = %v, want ErrInvalidConfig", err)
	}
	if _, err := inbox.NewGroup(nil); !errors.Is(err, inbox.ErrInvalidConfig) {
		t.Fatalf("NewGroup(nil) = %v, want ErrInvalidConfig", err)
	}
}

// mergeHandler is pipeHandler as an inbox.MergeHandler: the batches of a
// shared transaction go in one INSERT (or, with fail, QueueMerged refuses).
type mergeHandler struct {
	pipeHandler
	calls *atomic.Int64
	fail  bool
}

func (h mergeHandler) QueueMerged(b *pgx.Batch, hs []inbox.PipelineHandler, ds [][]inbox.Delivery, rs [][]inbox.BatchResult) error {
	h.calls.Add(1)
	if h.fail {
		return errors.New("cannot merge")
	}
	type at struct{ i, j int }
	where := map[string]at{}
	var ids, chats, bodies []string
	var seqs []int64
	for i := range hs {
		for j, d := range ds[i] {
			var p payload
			if err := json.Unmarshal(d.Payload, &p); err != nil {
				rs[i][j].Err = fmt.Errorf("decoding payload: %w: %w", inbox.ErrMalformed, err)
				continue
			}
			where[p.ID] = at{i, j}
			ids, chats, seqs, bodies = append(ids, p.ID), append(chats, strings.Trim(string(p.ChatID), `"`)), append(seqs, p.Seq), append(bodies, p.Body)
		}
	}
	b.Queue(`INSERT INTO t.inbox (message_id, chat_id, seq, body)
		SELECT u.i::uuid, u.c::bigint, u.s, u.b FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[]) AS u(i, c, s, b)
		ON CONFLICT (message_id) DO NOTHING RETURNING message_id::text`, ids, chats, seqs, bodies).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				return err
			}
			w := where[id]
			rs[w.i][w.j].Fresh, rs[w.i][w.j].Value = true, "v:"+id
		}
		return rows.Err()
	})
	return nil
}

// A shared transaction whose members' handlers are MergeHandlers queues all
// of their batches through one QueueMerged call (here one INSERT for all);
// when QueueMerged refuses, each member runs its batch alone.
func TestGroupMergesTheBatchesOfMergeHandlers(t *testing.T) {
	t.Parallel()
	for _, fail := range []bool{false, true} {
		t.Run(fmt.Sprintf("refuses=%v", fail), func(t *testing.T) {
			t.Parallel()
			e, g := groupEnv(t)
			key := int64(7104)
			if fail {
				key = 7105
			}
			release := holdLock(t, e.pool, key)
			var calls atomic.Int64
			mh := mergeHandler{calls: &calls, fail: fail}
			cs, srcs := groupMembers(t, e, g, lockingHandler{key: key}, mh, mh)
			da := deliveries(t, e, srcs[0], job("a"))
			b := []redisq.Job{job("b1"), job("b2")}
			c := []redisq.Job{job("c1")}
			db, dc := deliveries(t, e, srcs[1], b...), deliveries(t, e, srcs[2], c...)
			noErrors(t, sharedRound(t, e, g, key, release, memberRun{cs[0], da}, memberRun{cs[1], db}, memberRun{cs[2], dc}))
			if got := calls.Load(); got != 1 {
				t.Fatalf("QueueMerged calls = %d, want 1", got)
			}
			if n, p := e.rows(t), e.pending(t); n != 4 || p != 0 {
				t.Fatalf("inbox rows = %d, pending = %d; want 4 and 0", n, p)
			}
			if got := [2]int64{cs[1].Stats().Applied, cs[2].Stats().Applied}; got != [2]int64{2, 1} {
				t.Fatalf("applied by b and c = %v, want [2 1]", got)
			}
			xbc := xmins(t, e, append(b, c...)...)
			together := xbc[0] == xbc[1] && xbc[1] == xbc[2]
			if together == fail {
				t.Fatalf("b's and c's rows written by transactions %v; want one when merged, b's and c's own when refused", xbc)
			}
			if recs := e.logs.records(t, "shared inbox transaction failed; running the batch alone"); fail != (len(recs) == 2) {
				t.Fatalf("members that ran alone: %d log records", len(recs))
			}
		})
	}
}

// The connection of a shared transaction dies before its commit: nothing
// of it stays, each member runs its batch again alone, and every delivery
// is applied once and acknowledged.
func TestGroupConnectionLostMidTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, g := groupEnv(t)
	const k1, k2 = 7106, 7107
	release1, release2 := holdLock(t, e.pool, k1), holdLock(t, e.pool, k2)
	cs, srcs := groupMembers(t, e, g, lockingHandler{key: k1}, lockingHandler{key: k2}, pipeHandler{})
	da := deliveries(t, e, srcs[0], job("a"))
	db := deliveries(t, e, srcs[1], job("b1"), job("b2"))
	dc := deliveries(t, e, srcs[2], job("c1"), job("c2"))
	doneA := processAsync(ctx, cs[0], da)
	waitForLockWaiter(t, e, k1)
	doneB := processAsync(ctx, cs[1], db)
	testenv.WaitFor(t, 10*time.Second, "b waiting in the group", func() bool { return g.Waiting() == 1 })
	doneC := processAsync(ctx, cs[2], dc)
	testenv.WaitFor(t, 10*time.Second, "c waiting in the group", func() bool { return g.Waiting() == 2 })
	release1()
	if err := wait(t, "member a", doneA); err != nil {
		t.Fatal(err)
	}
	// b's and c's shared transaction now waits for k2: kill its backend.
	waitForLockWaiter(t, e, k2)
	if _, err := e.pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_locks
		WHERE locktype = 'advisory' AND NOT granted AND objid = $1`, k2); err != nil {
		t.Fatal(err)
	}
	// c alone commits; b alone waits for k2 again.
	if err := wait(t, "member c", doneC); err != nil {
		t.Fatal(err)
	}
	waitForLockWaiter(t, e, k2)
	release2()
	if err := wait(t, "member b", doneB); err != nil {
		t.Fatal(err)
	}
	if n, p := e.rows(t), e.pending(t); n != 5 || p != 0 {
		t.Fatalf("inbox rows = %d, pending = %d; want 5 and 0", n, p)
	}
	if got := [3]int64{cs[0].Stats().Applied, cs[1].Stats().Applied, cs[2].Stats().Applied}; got != [3]int64{1, 2, 2} {
		t.Fatalf("applied per member = %v, want [1 2 2]", got)
	}
	if recs := e.logs.records(t, "shared inbox transaction failed; running the batch alone"); len(recs) != 2 {
		t.Fatalf("members that ran alone: %d log records, want 2", len(recs))
	}
}
