package inbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/redisq"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const waitTimeout = 15 * time.Second

func TestConsumerAppliesJob(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.add(t, job("hello"))
	c := e.consumer(t, e.source(t, "w1"), testHandler, nil)
	if err := c.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	testenv.WaitFor(t, waitTimeout, "job applied and acked", func() bool {
		return c.Stats().Applied == 1 && e.pending(t) == 0
	})
	if n := e.rows(t); n != 1 {
		t.Fatalf("inbox rows = %d, want 1", n)
	}
	if got, want := c.Stats(), (inbox.Stats{Applied: 1}); got != want {
		t.Fatalf("Stats = %+v, want %+v", got, want)
	}
}

func TestConsumerSkipsDuplicate(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	j := job("twice")
	e.xadd(t, j) // bypass the dedupe key: the same job arrives twice
	e.xadd(t, j)
	e.add(t, job("other"))
	var evMu sync.Mutex
	var events []inbox.Event
	c := e.consumer(t, e.source(t, "w1"), testHandler, &inbox.Config{OnEvent: func(ev inbox.Event) {
		evMu.Lock()
		defer evMu.Unlock()
		if ev.Kind != inbox.EventBatch {
			events = append(events, ev)
		}
	}})
	if err := c.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	testenv.WaitFor(t, waitTimeout, "three deliveries handled and acked", func() bool {
		s := c.Stats()
		return s.Applied+s.Duplicates == 3 && e.pending(t) == 0
	})
	if got, want := c.Stats(), (inbox.Stats{Applied: 2, Duplicates: 1}); got != want {
		t.Fatalf("Stats = %+v, want %+v", got, want)
	}
	if n := e.rows(t); n != 2 {
		t.Fatalf("inbox rows = %d, want 2", n)
	}
	// The typed events: two applied, one duplicate naming the delivery.
	evMu.Lock()
	var applied, dups int
	for _, ev := range events {
		switch ev.Kind {
		case inbox.EventApplied:
			applied += ev.N
		case inbox.EventDuplicate:
			dups++
			if ev.MessageID != j.ID || ev.Ref == "" || ev.N != 1 {
				t.Errorf("duplicate event %+v, want message %s with its ref", ev, j.ID)
			}
		default:
			t.Errorf("unexpected event %+v", ev)
		}
	}
	evMu.Unlock()
	if applied != 2 || dups != 1 {
		t.Fatalf("events: %d applied, %d duplicates; want 2, 1", applied, dups)
	}
	// And the human-readable log line.
	recs := e.logs.records(t, "duplicate skipped")
	if len(recs) != 1 || recs[0]["message_id"] != j.ID || recs[0]["level"] != "INFO" {
		t.Fatalf(`"duplicate skipped" records = %v, want one at INFO with message_id %s`, recs, j.ID)
	}
}

func TestConsumerDeadLettersMalformed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.add(t,
		rawJob(`{"id": "not json`),
		job("good 1"),
		rawJob(`{"chat_id": 1, "seq": 1, "body": "no id"}`),
		job("good 2"),
		job("good 3"),
	)
	// An entry not written by Publisher.Add (no payload field): redisq marks
	// it with Delivery.Err and it never reaches the Handler.
	if err := e.rdb.XAdd(context.Background(), &redis.XAddArgs{
		Stream: e.keys.Stream, Values: []any{"id", "x", "name", "message.created"},
	}).Err(); err != nil {
		t.Fatalf("XADD: %v", err)
	}
	c := e.consumer(t, e.source(t, "w1"), testHandler, nil)
	if err := c.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	testenv.WaitFor(t, waitTimeout, "good jobs applied, malformed dead-lettered, nothing pending", func() bool {
		s := c.Stats()
		return s.Applied == 3 && s.DeadLettered == 3 && e.pending(t) == 0
	})
	if n := e.deadLen(t); n != 3 {
		t.Fatalf("dead stream length = %d, want 3", n)
	}
	if n := e.rows(t); n != 3 {
		t.Fatalf("inbox rows = %d, want 3", n)
	}
	// Nothing is blocked: a job added afterwards goes through.
	e.add(t, job("after"))
	testenv.WaitFor(t, waitTimeout, "later job applied", func() bool { return c.Stats().Applied == 4 })
}

func TestConsumerIsolatesPoison(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, chatID string
	}{
		{"check violation 23514", `"-7"`},
		{"invalid text 22P02", `"abc"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			poison := rawJob(fmt.Sprintf(`{"id": "%s", "chat_id": %s, "seq": 1, "body": "poison"}`,
				"00000000-0000-4000-8000-000000000001", tc.chatID))
			e.add(t, job("before"), poison, job("after 1"), job("after 2"))
			c := e.consumer(t, e.source(t, "w1"), testHandler, nil)
			if err := c.Start(context.Background()); err != nil {
				t.Fatalf("Start: %v", err)
			}
			testenv.WaitFor(t, waitTimeout, "poison dead-lettered, others applied", func() bool {
				s := c.Stats()
				return s.Applied == 3 && s.DeadLettered == 1 && e.pending(t) == 0
			})
			if n := e.rows(t); n != 3 {
				t.Fatalf("inbox rows = %d, want 3", n)
			}
			if n := e.deadLen(t); n != 1 {
				t.Fatalf("dead stream length = %d, want 1", n)
			}
			if recs := e.logs.records(t, "batch hit a permanent error; re-running one delivery per transaction"); len(recs) != 1 {
				t.Fatalf("isolation log records = %v, want one (all four jobs in one batch)", recs)
			}
			recs := e.logs.records(t, "delivery dead-lettered")
			if len(recs) != 1 || recs[0]["message_id"] != poison.ID {
				t.Fatalf("dead-letter log records = %v, want one for %s", recs, poison.ID)
			}
		})
	}
}

func TestConsumerPostgresDown(t *testing.T) {
	t.Parallel()
	srv := testenv.PrivatePostgres(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, srv.AdminURL())
	if err != nil {
		t.Fatalf("pgxpool.New: %v", err)
	}
	t.Cleanup(pool.Close)
	e := newEnvWithPool(t, pool)
	if err := srv.Stop(ctx); err != nil {
		t.Fatalf("stopping postgres: %v", err)
	}

	j := job("while postgres is down")
	e.add(t, j)
	var attempts atomic.Int64
	c := e.consumer(t, e.source(t, "w1"), testHandler, &inbox.Config{
		OnEvent: func(e inbox.Event) {
			if e.Kind == inbox.EventBatch {
				attempts.Add(1)
			}
		},
	})
	if err := c.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	testenv.WaitFor(t, waitTimeout, "several failed attempts", func() bool { return attempts.Load() >= 3 })
	if p := e.pending(t); p != 1 {
		t.Fatalf("pending = %d while postgres is down, want 1 (delivered, not acked)", p)
	}
	if s := c.Stats(); s != (inbox.Stats{}) {
		t.Fatalf("Stats = %+v while postgres is down, want zero", s)
	}

	if err := srv.Restart(ctx); err != nil {
		t.Fatalf("restarting postgres: %v", err)
	}
	testenv.WaitFor(t, waitTimeout, "job applied after restart and acked", func() bool {
		return c.Stats().Applied == 1 && e.pending(t) == 0
	})
	if n := e.rows(t); n != 1 {
		t.Fatalf("inbox rows = %d, want 1", n)
	}
	if s := c.Stats(); s.Duplicates != 0 {
		t.Fatalf("Stats = %+v, want no duplicates", s)
	}
}

var errCrash = errors.New("injected crash between commit and ack")

// crashBeforeAck is a Source whose Ack fails as if the process died right
// after the inbox commit.
type crashBeforeAck struct{ inbox.Source }

func (crashBeforeAck) Ack(context.Context, ...string) error {
	return fmt.Errorf("acking: %w", errCrash)
}

func TestConsumerCrashAfterCommitBeforeAck(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	j := job("committed, not acked")
	e.add(t, j)

	src := e.source(t, "w1")
	ds := fetchAll(t, src, 1)
	first := e.consumer(t, crashBeforeAck{src}, testHandler, nil)
	if err := first.ProcessBatch(context.Background(), ds); err != nil {
		t.Fatalf("ProcessBatch with failing ack = %v, want nil (commit was durable)", err)
	}
	if n, p := e.rows(t), e.pending(t); n != 1 || p != 1 {
		t.Fatalf("after crash: rows = %d, pending = %d; want 1, 1", n, p)
	}

	// The restarted worker, same consumer name, reads its pending entry first.
	second := e.consumer(t, e.source(t, "w1"), testHandler, nil)
	if err := second.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	testenv.WaitFor(t, waitTimeout, "pending entry skipped as duplicate and acked", func() bool {
		return second.Stats().Duplicates == 1 && e.pending(t) == 0
	})
	if got, want := second.Stats(), (inbox.Stats{Duplicates: 1}); got != want {
		t.Fatalf("Stats = %+v, want %+v", got, want)
	}
	if n := e.rows(t); n != 1 {
		t.Fatalf("inbox rows = %d, want 1", n)
	}
	if recs := e.logs.records(t, "duplicate skipped"); len(recs) != 1 || recs[0]["message_id"] != j.ID {
		t.Fatalf(`"duplicate skipped" records = %v, want one for %s`, recs, j.ID)
	}
}

// fetchCtxSource remembers the ctx of the last Fetch that returned
// deliveries, so a test can see when Stop cancelled fetching.
type fetchCtxSource struct {
	inbox.Source
	mu  sync.Mutex
	ctx context.Context
}

func (s *fetchCtxSource) Fetch(ctx context.Context, max int) ([]inbox.Delivery, error) {
	ds, err := s.Source.Fetch(ctx, max)
	if len(ds) > 0 {
		s.mu.Lock()
		s.ctx = ctx
		s.mu.Unlock()
	}
	return ds, err
}

func (s *fetchCtxSource) fetchStopped() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ctx != nil && s.ctx.Err() != nil
}

// blockingHandler applies like testHandler after the test releases it.
type blockingHandler struct {
	entered chan struct{} // closed by the first Apply
	once    sync.Once
	release chan struct{}
}

func newBlockingHandler() *blockingHandler {
	return &blockingHandler{entered: make(chan struct{}), release: make(chan struct{})}
}

func (h *blockingHandler) Apply(ctx context.Context, tx pgx.Tx, d inbox.Delivery) (bool, error) {
	h.once.Do(func() { close(h.entered) })
	select {
	case <-h.release:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	return applyInbox(ctx, tx, d)
}

func TestConsumerStopFinishesInFlightBatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.add(t, job("in flight 1"), job("in flight 2"))
	src := &fetchCtxSource{Source: e.source(t, "w1")}
	h := newBlockingHandler()
	c := e.consumer(t, src, h, nil)
	if err := c.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	<-h.entered

	stopped := make(chan error, 1)
	go func() { stopped <- c.Stop(context.Background()) }()
	testenv.WaitFor(t, waitTimeout, "Stop cancelled fetching", src.fetchStopped)
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned %v before the in-flight batch finished", err)
	default:
	}
	close(h.release)
	if err := <-stopped; err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if got := c.Stats().Applied; got != 2 {
		t.Fatalf("Applied = %d after Stop, want 2", got)
	}
	if n, p := e.rows(t), e.pending(t); n != 2 || p != 0 {
		t.Fatalf("after Stop: rows = %d, pending = %d; want 2, 0", n, p)
	}
	if err := c.Stop(context.Background()); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	// One lifecycle contract (internal/service): a stopped Consumer starts
	// again, and a second Start while it runs is refused.
	if err := c.Start(context.Background()); err != nil {
		t.Fatalf("Start after Stop = %v", err)
	}
	if err := c.Start(context.Background()); !errors.Is(err, inbox.ErrStarted) {
		t.Fatalf("second Start = %v, want ErrStarted", err)
	}
	if err := c.Stop(context.Background()); err != nil {
		t.Fatalf("Stop of the second run: %v", err)
	}
}

func TestConsumerStopDeadlineAbortsBatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.add(t, job("aborted"))
	h := newBlockingHandler()
	c := e.consumer(t, e.source(t, "w1"), h, nil)
	if err := c.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	<-h.entered
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // give up at once: the in-flight batch is aborted
	if err := c.Stop(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Stop with done ctx = %v, want context.Canceled", err)
	}
	if n, p := e.rows(t), e.pending(t); n != 0 || p != 1 {
		t.Fatalf("after aborted Stop: rows = %d, pending = %d; want 0, 1 (redelivered later)", n, p)
	}
}

func TestConsumerRefusesAsyncCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := asyncCommitPool(t)
	var outside string
	if err := pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&outside); err != nil || outside != "off" {
		t.Fatalf("pool synchronous_commit = %q, %v; want off", outside, err)
	}
	e := newEnvWithPool(t, pool)
	e.add(t, job("durable"))
	src := e.source(t, "w1")
	inside := syncCommitInside(t, e, src)
	if inside != "on" {
		t.Fatalf("synchronous_commit inside the inbox transaction = %q, want on", inside)
	}
}

func TestConsumerKeepsStrongerSyncCommit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `ALTER DATABASE `+currentDB(t, e)+` SET synchronous_commit = remote_apply`); err != nil {
		t.Fatalf("setting database default: %v", err)
	}
	e.pool.Reset() // new connections pick up the database default
	e.add(t, job("remote apply"))
	src := e.source(t, "w1")
	inside := syncCommitInside(t, e, src)
	if inside != "remote_apply" {
		t.Fatalf("synchronous_commit inside = %q, want remote_apply (left alone)", inside)
	}
}

// syncCommitInside processes the one job of src and returns the
// synchronous_commit setting its inbox transaction ran with.
func syncCommitInside(t *testing.T, e *env, src inbox.Source) string {
	t.Helper()
	var inside string
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, d inbox.Delivery) (bool, error) {
		if err := tx.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&inside); err != nil {
			return false, err
		}
		return applyInbox(ctx, tx, d)
	})
	c := e.consumer(t, src, h, nil)
	if err := c.ProcessBatch(context.Background(), fetchAll(t, src, 1)); err != nil {
		t.Fatalf("ProcessBatch: %v", err)
	}
	return inside
}

func currentDB(t *testing.T, e *env) string {
	t.Helper()
	var db string
	if err := e.pool.QueryRow(context.Background(), `SELECT quote_ident(current_database())`).Scan(&db); err != nil {
		t.Fatalf("current_database: %v", err)
	}
	return db
}

// TestConsumerAppliesInOrder checks that one batch is applied in Fetch order.
func TestConsumerAppliesInOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var jobs []redisq.Job
	for i := range 50 {
		jobs = append(jobs, job(fmt.Sprint(i)))
	}
	e.add(t, jobs...)
	var mu sync.Mutex
	var order []string
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, d inbox.Delivery) (bool, error) {
		mu.Lock()
		order = append(order, d.ID)
		mu.Unlock()
		return applyInbox(ctx, tx, d)
	})
	c := e.consumer(t, e.source(t, "w1"), h, &inbox.Config{BatchSize: 7})
	if err := c.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	testenv.WaitFor(t, waitTimeout, "all applied", func() bool { return c.Stats().Applied == 50 })
	mu.Lock()
	defer mu.Unlock()
	for i, j := range jobs {
		if order[i] != j.ID {
			t.Fatalf("apply #%d = %s, want %s", i, order[i], j.ID)
		}
	}
}

func TestNewConsumerValidates(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	src := redisq.InboxSource(nil)
	cases := []struct {
		name    string
		pool    *pgxpool.Pool
		src     inbox.Source
		h       inbox.Handler
		cfg     *inbox.Config
		wantErr bool
	}{
		{"nil config", pool, src, testHandler, nil, false},
		{"zero config", pool, src, testHandler, &inbox.Config{}, false},
		{"large backoff raises max", pool, src, testHandler, &inbox.Config{RetryBackoff: 5 * time.Second}, false},
		{"negative timeout means none", pool, src, testHandler, &inbox.Config{BatchTimeout: -1}, false},
		{"nil pool", nil, src, testHandler, nil, true},
		{"nil source", pool, nil, testHandler, nil, true},
		{"nil handler", pool, src, nil, nil, true},
		{"negative batch", pool, src, testHandler, &inbox.Config{BatchSize: -1}, true},
		{"negative backoff", pool, src, testHandler, &inbox.Config{RetryBackoff: -1}, true},
		{"negative max backoff", pool, src, testHandler, &inbox.Config{MaxRetryBackoff: -1}, true},
		{"max below backoff", pool, src, testHandler,
			&inbox.Config{RetryBackoff: time.Second, MaxRetryBackoff: time.Millisecond}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := inbox.NewConsumer(tc.pool, tc.src, tc.h, tc.cfg)
			if tc.wantErr {
				if !errors.Is(err, inbox.ErrInvalidConfig) || c != nil {
					t.Fatalf("NewConsumer = %v, %v; want nil, ErrInvalidConfig", c, err)
				}
				return
			}
			if err != nil || c == nil {
				t.Fatalf("NewConsumer = %v, %v; want a consumer", c, err)
			}
			if err := c.Stop(context.Background()); err != nil {
				t.Fatalf("Stop before Start: %v", err)
			}
		})
	}
}

// valueHandler is a BatchHandler over applyInbox whose fresh results carry
// the delivery's id as their Value; its first batch fails transiently once.
type valueHandler struct{ failedOnce atomic.Bool }

func (h *valueHandler) Apply(ctx context.Context, tx pgx.Tx, d inbox.Delivery) (bool, error) {
	return applyInbox(ctx, tx, d)
}

func (h *valueHandler) ApplyBatch(ctx context.Context, tx pgx.Tx, ds []inbox.Delivery) ([]inbox.BatchResult, error) {
	rs := make([]inbox.BatchResult, len(ds))
	for i, d := range ds {
		fresh, err := applyInbox(ctx, tx, d)
		if err != nil && !errors.Is(err, inbox.ErrMalformed) {
			return nil, err
		}
		rs[i] = inbox.BatchResult{Fresh: fresh, Err: err}
		if fresh {
			rs[i].Value = "v:" + d.ID
		}
	}
	if h.failedOnce.CompareAndSwap(false, true) {
		return nil, errors.New("transient: first batch rolled back")
	}
	return rs, nil
}

// AfterCommit sees each fresh delivery exactly once, with its Value, only
// after its row is committed (visible to another connection); never the
// duplicates, the malformed ones or a rolled-back attempt.
func TestAfterCommitSeesCommittedFreshDeliveries(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a, b := job("a"), job("b")
	e.xadd(t, a)
	e.xadd(t, a) // a duplicate delivery
	e.add(t, b, rawJob(`{"id": "not json`))
	var mu sync.Mutex
	seen := map[string]int{}
	var problems []string
	hook := func(applied []inbox.Applied) {
		for _, x := range applied {
			var n int
			err := e.pool.QueryRow(context.Background(),
				`SELECT count(*) FROM t.inbox WHERE message_id = $1`, x.Delivery.ID).Scan(&n)
			mu.Lock()
			seen[x.Delivery.ID]++
			switch {
			case err != nil || n != 1:
				problems = append(problems, fmt.Sprintf("%s: row not committed yet (count %d, err %v)", x.Delivery.ID, n, err))
			case x.Value != "v:"+x.Delivery.ID:
				problems = append(problems, fmt.Sprintf("%s: value %v", x.Delivery.ID, x.Value))
			}
			mu.Unlock()
		}
	}
	c := e.consumer(t, e.source(t, "w1"), &valueHandler{}, &inbox.Config{AfterCommit: hook})
	if err := c.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	testenv.WaitFor(t, waitTimeout, "all deliveries handled", func() bool {
		s := c.Stats()
		return s.Applied == 2 && s.Duplicates == 1 && s.DeadLettered == 1 && e.pending(t) == 0
	})
	mu.Lock()
	defer mu.Unlock()
	if len(problems) > 0 {
		t.Fatalf("AfterCommit problems: %v", problems)
	}
	if len(seen) != 2 || seen[a.ID] != 1 || seen[b.ID] != 1 {
		t.Fatalf("AfterCommit saw %v, want %s and %s once each", seen, a.ID, b.ID)
	}
}

// pipeHandler is the test handler as an inbox.PipelineHandler: one INSERT
// per delivery, queued, plus (when syncCommit is set) a SHOW of
// synchronous_commit inside the transaction. Fresh results carry "v:<id>".
type pipeHandler struct {
	syncCommit *string
}

func (h pipeHandler) Apply(ctx context.Context, tx pgx.Tx, d inbox.Delivery) (bool, error) {
	return applyInbox(ctx, tx, d)
}

func (h pipeHandler) ApplyBatch(ctx context.Context, tx pgx.Tx, ds []inbox.Delivery) ([]inbox.BatchResult, error) {
	rs := make([]inbox.BatchResult, len(ds))
	b := &pgx.Batch{}
	if err := h.QueueBatch(b, ds, rs); err != nil {
		return nil, err
	}
	return rs, tx.SendBatch(ctx, b).Close()
}

func (h pipeHandler) QueueBatch(b *pgx.Batch, ds []inbox.Delivery, rs []inbox.BatchResult) error {
	if h.syncCommit != nil {
		b.Queue(`SHOW synchronous_commit`).QueryRow(func(row pgx.Row) error { return row.Scan(h.syncCommit) })
	}
	for i, d := range ds {
		var p payload
		if err := json.Unmarshal(d.Payload, &p); err != nil {
			rs[i].Err = fmt.Errorf("decoding payload: %w: %w", inbox.ErrMalformed, err)
			continue
		}
		b.Queue(`INSERT INTO t.inbox (message_id, chat_id, seq, body)
			VALUES ($1, $2::text::bigint, $3, $4) ON CONFLICT (message_id) DO NOTHING`,
			p.ID, strings.Trim(string(p.ChatID), `"`), p.Seq, p.Body).Exec(func(ct pgconn.CommandTag) error {
			if ct.RowsAffected() == 1 {
				rs[i].Fresh, rs[i].Value = true, "v:"+d.ID
			}
			return nil
		})
	}
	return nil
}

// The pipelined transaction (BEGIN … COMMIT in one batch) keeps the
// Consumer's guarantees: a poison statement aborts the batch, which is
// re-run one delivery per transaction; the poison is dead-lettered, nothing
// of it is left, the rest is applied once and handed to AfterCommit once;
// synchronous_commit=off is refused inside it.
func TestPipelinedTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := asyncCommitPool(t)
	e := newEnvWithPool(t, pool)
	poison := rawJob(`{"id": "00000000-0000-4000-8000-000000000002", "chat_id": "-7", "seq": 1, "body": "poison"}`)
	good := []redisq.Job{job("before"), job("after 1"), job("after 2")}
	e.xadd(t, good[0])
	e.xadd(t, good[0]) // a duplicate in the same batch
	e.add(t, poison, good[1], good[2], rawJob(`{"id": "not json`))
	var mu sync.Mutex
	handed := map[string]int{}
	var inside string
	h := pipeHandler{syncCommit: &inside}
	c := e.consumer(t, e.source(t, "w1"), h, &inbox.Config{AfterCommit: func(as []inbox.Applied) {
		mu.Lock()
		defer mu.Unlock()
		for _, a := range as {
			if a.Value != "v:"+a.Delivery.ID {
				t.Errorf("AfterCommit value %v for %s", a.Value, a.Delivery.ID)
			}
			handed[a.Delivery.ID]++
		}
	}})
	if err := c.ProcessBatch(ctx, fetchAll(t, e.source(t, "w1"), 6)); err != nil {
		t.Fatalf("ProcessBatch: %v", err)
	}
	if got, want := c.Stats(), (inbox.Stats{Applied: 3, Duplicates: 1, DeadLettered: 2}); got != want {
		t.Fatalf("Stats = %+v, want %+v", got, want)
	}
	if n := e.rows(t); n != 3 {
		t.Fatalf("inbox rows = %d, want 3", n)
	}
	if recs := e.logs.records(t, "batch hit a permanent error; re-running one delivery per transaction"); len(recs) != 1 {
		t.Fatalf("isolation log records = %v, want one", recs)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, j := range good {
		if handed[j.ID] != 1 {
			t.Fatalf("AfterCommit saw %v, want each of the three good jobs once", handed)
		}
	}
	if len(handed) != 3 {
		t.Fatalf("AfterCommit saw %v, want only the three good jobs", handed)
	}
	if inside != "on" {
		t.Fatalf("synchronous_commit inside the pipelined transaction = %q, want on", inside)
	}
}

// asyncCommitPool is a pool on the test database whose sessions default to
// synchronous_commit=off, closed at cleanup.
func asyncCommitPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	cfg := testenv.Pool(t).Config().Copy()
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pgxpool.NewWithConfig: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}
