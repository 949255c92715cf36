package inbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/internal/backoff"
	"github.com/outboxchat/outboxchat/internal/service"
)

// Defaults for Config fields left zero.
const (
	// DefaultBatchSize is the default Config.BatchSize.
	DefaultBatchSize = 100
	// DefaultRetryBackoff is the default Config.RetryBackoff.
	DefaultRetryBackoff = 100 * time.Millisecond
	// DefaultMaxRetryBackoff is the default Config.MaxRetryBackoff.
	DefaultMaxRetryBackoff = 2 * time.Second
	// DefaultBatchTimeout is the default Config.BatchTimeout.
	DefaultBatchTimeout = 30 * time.Second
)

var (
	// ErrMalformed marks input that can never succeed (undecodable payload,
	// missing id). A Handler wraps it, before touching the transaction; the
	// Consumer dead-letters the delivery. See Handler.
	ErrMalformed = errors.New("inbox: malformed delivery")

	// ErrSettled is wrapped by a Source's DeadLetter when the delivery was
	// no longer this consumer's to settle: another consumer of the queue
	// took it over (after the lock duration) and settled it, so nothing was
	// moved and nothing comes back. The Consumer then neither counts it in
	// Stats.DeadLettered nor reports EventDeadLettered, and logs it at Info.
	ErrSettled = errors.New("inbox: delivery already settled by another consumer")

	// ErrInvalidConfig is returned (wrapped) by NewConsumer for a nil
	// dependency or an out-of-range Config field.
	ErrInvalidConfig = errors.New("inbox: invalid config")

	// ErrStarted is wrapped by Start while the Consumer's previous run has
	// not fully stopped. It is internal/service's ErrAlreadyStarted
	// (outbox.ErrAlreadyStarted too), so errors.Is matches either.
	ErrStarted = service.ErrAlreadyStarted
)

// EventKind names a typed event of the Consumer (Event.Kind). The values
// are stable strings, so a program can log them for another to read (the
// chat lab does).
type EventKind string

// Consumer event kinds, each reported after the commit that made it
// durable (EventDeadLettered: after the DeadLetter call succeeded).
const (
	// EventApplied: N ≥ 1 deliveries of one transaction were recorded as
	// new inbox rows.
	EventApplied EventKind = "inbox.applied"
	// EventDuplicate: one delivery (MessageID, Ref) was skipped because its
	// inbox row already existed.
	EventDuplicate EventKind = "inbox.duplicate"
	// EventDeadLettered: one delivery (MessageID, Ref) was moved to the
	// dead letter for Reason.
	EventDeadLettered EventKind = "inbox.dead_lettered"
	// EventBatch: one batch attempt ended (success or failure) after
	// Duration, begin to commit and ack.
	EventBatch EventKind = "inbox.batch"
)

// Event is one typed event of the Consumer, given to Config.OnEvent.
type Event struct {
	Kind EventKind
	// N is the number of deliveries (EventApplied; 1 for the others).
	N int
	// MessageID and Ref identify the delivery (EventDuplicate,
	// EventDeadLettered).
	MessageID, Ref string
	// Reason is why it was dead-lettered (EventDeadLettered).
	Reason string
	// Duration is the batch attempt's (EventBatch).
	Duration time.Duration
}

// Config configures a Consumer. A nil *Config means all defaults; a zero
// field means its default.
type Config struct {
	// BatchSize is the maximum number of deliveries fetched and applied in
	// one transaction. Default DefaultBatchSize (100). Must not be negative.
	BatchSize int

	// RetryBackoff is the wait after the first transient error (a failed
	// Fetch, or a batch rolled back for a non-permanent error); it doubles
	// after each further consecutive error up to MaxRetryBackoff and resets
	// after a success (a Fetch that returned, even with nothing, or a
	// committed batch). Default DefaultRetryBackoff (100 ms). Must not be
	// negative.
	RetryBackoff time.Duration

	// MaxRetryBackoff caps the doubling of RetryBackoff. Default
	// DefaultMaxRetryBackoff (2 s), or RetryBackoff when that is larger.
	// When set, it must not be less than RetryBackoff.
	MaxRetryBackoff time.Duration

	// BatchTimeout bounds one batch attempt: begin, every Apply, commit, ack
	// and dead letters (so a hung network cannot stall the consumer). An
	// attempt that times out is rolled back and retried as transient; if the
	// commit itself timed out, the retry sees duplicates. Default
	// DefaultBatchTimeout (30 s); negative means no timeout.
	BatchTimeout time.Duration

	// Logger receives the Consumer's logs, with attribute
	// component=inbox. Default slog.Default().
	Logger *slog.Logger

	// OnEvent, when set, receives every typed Event of the Consumer (the app
	// feeds Prometheus and its event log from it). Called from the
	// Consumer's goroutine (or the ProcessBatch caller's); must not block.
	// Default nil.
	OnEvent func(Event)

	// AfterCommit, when set, is called after every inbox commit that
	// recorded new rows, before the Ack, with those deliveries in batch
	// order. It is a latency shortcut, not a delivery guarantee: a crash
	// between the commit and the call skips it (so does a pipelined batch
	// reported failed after its COMMIT ran, see PipelineHandler), so whatever it feeds must
	// also learn of the rows from the database (the chat's gateway still
	// has its NOTIFY, poll and catch-up). It runs on the Consumer's
	// goroutine and must not block. Default nil.
	AfterCommit func(applied []Applied)

	// Group, when set, shares this Consumer's inbox transactions with the
	// Group's other members (see Group): batches that arrive while another
	// member's transaction is in flight commit together in the next one.
	// It must have been made with the Consumer's pool. It applies to a
	// PipelineHandler only; another Handler commits its own transactions.
	// Default nil: every batch is a transaction of its own.
	Group *Group
}

// Stats are cumulative counters of a Consumer, counted after the commit
// that made them durable (DeadLettered: after the DeadLetter call
// succeeded).
type Stats struct {
	// Applied is the number of deliveries recorded as new inbox rows.
	Applied int64
	// Duplicates is the number of deliveries skipped because their inbox
	// row already existed.
	Duplicates int64
	// DeadLettered is the number of deliveries moved to the dead letter.
	DeadLettered int64
}

// Consumer moves deliveries from a Source into the inbox: Fetch, apply the
// batch in one transaction, commit, then Ack. See the package doc for the
// invariants and failure modes.
//
// Start runs one goroutine; Stop stops it. Stats, Start, Stop, Started and
// Stopped are safe for concurrent use.
type Consumer struct {
	pool        *pgxpool.Pool
	src         Source
	h           Handler
	batch       int
	backoff     time.Duration
	maxBack     time.Duration
	timeout     time.Duration
	log         *slog.Logger
	onEvent     func(Event)
	afterCommit func([]Applied)
	group       *Group
	rank        int64 // in group
	applied     atomic.Int64
	dups        atomic.Int64
	deadLets    atomic.Int64

	life service.Lifecycle
}

// WithDefaults returns a copy of c in which every zero field holds its
// default: BatchSize DefaultBatchSize, RetryBackoff DefaultRetryBackoff,
// MaxRetryBackoff the larger of DefaultMaxRetryBackoff and RetryBackoff,
// BatchTimeout DefaultBatchTimeout, Logger slog.Default(). Negative values
// are kept (NewConsumer rejects them, except a negative BatchTimeout: no
// timeout). A nil c gives all defaults.
func (c *Config) WithDefaults() *Config {
	d := *cmp.Or(c, &Config{})
	d.BatchSize = cmp.Or(d.BatchSize, DefaultBatchSize)
	d.RetryBackoff = cmp.Or(d.RetryBackoff, DefaultRetryBackoff)
	d.MaxRetryBackoff = cmp.Or(d.MaxRetryBackoff, max(DefaultMaxRetryBackoff, d.RetryBackoff))
	d.BatchTimeout = cmp.Or(d.BatchTimeout, DefaultBatchTimeout)
	d.Logger = cmp.Or(d.Logger, slog.Default())
	return &d
}

// validate checks a config that went through WithDefaults. Errors wrap
// ErrInvalidConfig.
func (c *Config) validate() error {
	switch {
	case c.BatchSize < 0:
		return fmt.Errorf("BatchSize %d < 0: %w", c.BatchSize, ErrInvalidConfig)
	case c.RetryBackoff < 0:
		return fmt.Errorf("RetryBackoff %v < 0: %w", c.RetryBackoff, ErrInvalidConfig)
	case c.MaxRetryBackoff < 0:
		return fmt.Errorf("MaxRetryBackoff %v < 0: %w", c.MaxRetryBackoff, ErrInvalidConfig)
	case c.MaxRetryBackoff < c.RetryBackoff:
		return fmt.Errorf("MaxRetryBackoff %v < RetryBackoff %v: %w", c.MaxRetryBackoff, c.RetryBackoff, ErrInvalidConfig)
	}
	return nil
}

// NewConsumer returns a Consumer that reads from src and applies deliveries
// with h in transactions on pool. It validates eagerly (after
// Config.WithDefaults) and returns an error wrapping ErrInvalidConfig for a
// nil pool, src or h, an out-of-range Config field, or a Config.Group made
// with another pool. It does not touch the
// network. The Consumer does not close pool or src.
func NewConsumer(pool *pgxpool.Pool, src Source, h Handler, cfg *Config) (*Consumer, error) {
	switch {
	case pool == nil:
		return nil, fmt.Errorf("creating inbox consumer: nil pool: %w", ErrInvalidConfig)
	case src == nil:
		return nil, fmt.Errorf("creating inbox consumer: nil source: %w", ErrInvalidConfig)
	case h == nil:
		return nil, fmt.Errorf("creating inbox consumer: nil handler: %w", ErrInvalidConfig)
	case cfg != nil && cfg.Group != nil && cfg.Group.pool != pool:
		return nil, fmt.Errorf("creating inbox consumer: Group runs on another pool: %w", ErrInvalidConfig)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("creating inbox consumer: %w", err)
	}
	var rank int64
	if cfg.Group != nil {
		rank = cfg.Group.q.Join()
	}
	return &Consumer{
		rank:        rank,
		pool:        pool,
		src:         src,
		h:           h,
		batch:       cfg.BatchSize,
		backoff:     cfg.RetryBackoff,
		maxBack:     cfg.MaxRetryBackoff,
		timeout:     cfg.BatchTimeout,
		log:         cfg.Logger.With("component", "inbox"),
		onEvent:     cfg.OnEvent,
		afterCommit: cfg.AfterCommit,
		group:       cfg.Group,
		life:        service.Lifecycle{Name: "inbox: consumer"},
	}, nil
}

// Start starts the Consumer's goroutine and returns at once: it fetches up
// to BatchSize deliveries, applies them in one transaction, commits, acks,
// and repeats; on a transient error it backs off and retries the same batch.
//
// It follows the contract of internal/service: cancelling ctx is a hard
// stop that aborts fetching and any in-flight batch (rolled back; the
// deliveries come back later); use Stop for a graceful shutdown. Errors:
// ErrStarted while a run is in progress, or ctx.Err() (both wrapped). Start
// may be called again after a stop. Safe for concurrent use with Stop.
func (c *Consumer) Start(ctx context.Context) error {
	return c.life.Start(ctx, func(r *service.Run) {
		r.Go(func() { c.run(r.DrainContext(), r.Context()) })
	})
}

// Stop stops fetching, lets the in-flight batch finish (commit, ack, dead
// letters) and waits for the goroutine to return. A batch waiting to be
// retried after a transient error is abandoned: it was not acknowledged and
// comes back from the queue.
//
// If ctx ends first, Stop aborts the in-flight batch (rolled back,
// redelivered later), still waits for the goroutine, and returns an error
// wrapping ctx.Err(). Stop is idempotent and safe for concurrent use; nil
// when not running.
func (c *Consumer) Stop(ctx context.Context) error {
	return c.life.Stop(ctx)
}

// Started returns a channel closed once the latest Start succeeded.
func (c *Consumer) Started() <-chan struct{} { return c.life.Started() }

// Stopped returns a channel closed once the latest run's goroutine has
// returned (closed before the first Start).
func (c *Consumer) Stopped() <-chan struct{} { return c.life.Stopped() }

// Stats returns the cumulative counters. Safe for concurrent use.
func (c *Consumer) Stats() Stats {
	return Stats{
		Applied:      c.applied.Load(),
		Duplicates:   c.dups.Load(),
		DeadLettered: c.deadLets.Load(),
	}
}

// ProcessBatch applies ds in one transaction in order, commits, acks the
// applied and duplicate deliveries and dead-letters the malformed ones, as
// the running Consumer does for each fetched batch. A permanent SQL error
// makes it re-run ds one delivery per transaction to isolate the poison.
//
// It returns nil once every delivery is durably handled (recorded, skipped
// as duplicate, or set aside for the dead letter), even when Ack or
// DeadLetter then failed (logged; those deliveries come back). It returns a
// transient error (wrapped) when some deliveries were neither committed nor
// acknowledged: retry them. It is exported for tests and benchmarks; do not
// call it on a Source the running Consumer is using unless the Source is
// safe for concurrent use.
func (c *Consumer) ProcessBatch(ctx context.Context, ds []Delivery) error {
	_, err := c.process(ctx, ds)
	return err
}

// run is the Consumer's goroutine. fetchCtx ends on Stop; workCtx ends when
// the Start ctx ends, Stop gives up waiting, or the run is over.
func (c *Consumer) run(fetchCtx, workCtx context.Context) {
	var pending []Delivery // a batch to retry before fetching anything new
	failures := 0
	for fetchCtx.Err() == nil {
		if len(pending) == 0 {
			ds, err := c.src.Fetch(fetchCtx, c.batch)
			if err != nil {
				if fetchCtx.Err() != nil {
					return
				}
				wait := backoff.Delay(c.backoff, c.maxBack, failures)
				failures++
				c.log.Warn("fetch failed", "err", err, "retry_in", wait, "failures", failures)
				if !backoff.Sleep(fetchCtx, nil, wait) {
					return
				}
				continue
			}
			// A fetch that worked, empty or not, ends a run of fetch
			// errors: the next incident starts again at RetryBackoff (a
			// count carried across unrelated incidents would make an idle
			// consumer wait MaxRetryBackoff at the first error).
			failures = 0
			pending = ds
			if len(pending) == 0 {
				continue
			}
		}
		rest, err := c.process(workCtx, pending)
		if err == nil {
			pending, failures = nil, 0
			continue
		}
		if workCtx.Err() != nil {
			return
		}
		pending = rest
		wait := backoff.Delay(c.backoff, c.maxBack, failures)
		failures++
		c.log.Warn("batch failed, not acknowledged, will retry", "err", err,
			"deliveries", len(rest), "retry_in", wait, "failures", failures)
		if !backoff.Sleep(fetchCtx, nil, wait) {
			c.log.Info("stopping with a batch not acknowledged; the queue delivers it again",
				"deliveries", len(rest))
			return
		}
	}
}

// IsPermanent reports whether err can never succeed when retried: it wraps
// ErrMalformed, or a Postgres error of SQLSTATE class 22 (data exception)
// or 23 (integrity constraint violation). Everything else (connection
// errors, timeouts, serialization failures, deadlocks, context errors) is
// transient.
func IsPermanent(err error) bool {
	if errors.Is(err, ErrMalformed) {
		return true
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	return strings.HasPrefix(pgErr.Code, "22") || strings.HasPrefix(pgErr.Code, "23")
}

// outcome is what became of one delivery in a committed transaction.
type outcome int

const (
	outcomeApplied outcome = iota
	outcomeDuplicate
	outcomeDead // dead-letter after the commit
)

type result struct {
	d       Delivery
	outcome outcome
	reason  string // for outcomeDead
	value   any    // BatchResult.Value, for outcomeApplied
}

// process handles one batch attempt. On a transient error it returns the
// deliveries still to be retried (not committed, not acknowledged).
func (c *Consumer) process(ctx context.Context, ds []Delivery) ([]Delivery, error) {
	if len(ds) == 0 {
		return nil, nil
	}
	start := time.Now()
	defer func() {
		d := time.Since(start)
		c.event(Event{Kind: EventBatch, N: len(ds), Duration: d})
	}()
	if c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	results, err := c.apply(ctx, ds)
	if err == nil {
		c.finish(ctx, results)
		return nil, nil
	}
	if !IsPermanent(err) || ctx.Err() != nil {
		return ds, err
	}
	c.log.Info("batch hit a permanent error; re-running one delivery per transaction",
		"err", err, "deliveries", len(ds))
	return c.isolate(ctx, ds)
}

// isolate applies ds one delivery per transaction, dead-letters those that
// fail permanently and stops at the first transient error, returning the
// deliveries from there on.
func (c *Consumer) isolate(ctx context.Context, ds []Delivery) ([]Delivery, error) {
	var done []result
	for i, d := range ds {
		rs, err := c.apply(ctx, ds[i:i+1])
		switch {
		case err == nil:
			done = append(done, rs...)
		case IsPermanent(err):
			done = append(done, result{d: d, outcome: outcomeDead, reason: err.Error()})
		default:
			c.finish(ctx, done)
			return ds[i:], err
		}
	}
	c.finish(ctx, done)
	return nil, nil
}

// beginSQL opens the inbox transaction and refuses synchronous_commit=off
// for it (invariant 4: the ack follows a durable commit). Stronger settings
// (local, on, remote_write, remote_apply) are kept. Sent as one simple-protocol
// message, so the guard costs no extra round trip.
const beginSQL = `BEGIN; SELECT set_config('synchronous_commit', 'on', true) ` +
	`WHERE current_setting('synchronous_commit') = 'off'`

// guardSQL is beginSQL's guard as a statement of its own, for a pipelined
// batch (one prepared statement per queued query).
const guardSQL = `SELECT set_config('synchronous_commit', 'on', true) ` +
	`WHERE current_setting('synchronous_commit') = 'off'`

// apply runs ds through the Handler in one transaction and commits it.
func (c *Consumer) apply(ctx context.Context, ds []Delivery) (results []result, err error) {
	if ph, ok := c.h.(PipelineHandler); ok {
		results, err = c.applyPipelined(ctx, ph, ds)
	} else {
		results, err = c.applyTx(ctx, ds)
	}
	if err != nil {
		return nil, err
	}
	if c.afterCommit != nil {
		applied := make([]Applied, 0, len(results))
		for _, r := range results {
			if r.outcome == outcomeApplied {
				applied = append(applied, Applied{Delivery: r.d, Value: r.value})
			}
		}
		if len(applied) > 0 {
			c.afterCommit(applied)
		}
	}
	return results, nil
}

// applyPipelined is apply for a PipelineHandler: BEGIN, the guard, the
// handler's statements and COMMIT in one pipelined batch, shared with other
// members' batches when the Consumer is in a Group.
func (c *Consumer) applyPipelined(ctx context.Context, ph PipelineHandler, ds []Delivery) ([]result, error) {
	results, todo := splitUnreadable(ds)
	if len(todo) == 0 {
		return results, nil
	}
	rs := make([]BatchResult, len(todo))
	var err error
	if c.group != nil {
		err = c.group.commit(ctx, c.rank, &groupReq{ph: ph, ds: todo, rs: rs})
		if errors.Is(err, errShared) {
			// Another member's statement, or the connection, failed the
			// shared transaction: this batch alone tells which.
			c.log.Debug("shared inbox transaction failed; running the batch alone", "err", err)
			clear(rs)
			err = c.pipelineAlone(ctx, ph, todo, rs)
		}
	} else {
		err = c.pipelineAlone(ctx, ph, todo, rs)
	}
	if err != nil {
		return nil, err
	}
	more, err := classify(todo, rs)
	if err != nil {
		// Impossible after a commit unless the handler broke its contract
		// (a non-malformed Err): the rows are in; report it, ack nothing.
		return nil, err
	}
	return appendResults(results, more), nil
}

// pipelineAlone runs ds's statements in a pipelined transaction of their
// own.
func (c *Consumer) pipelineAlone(ctx context.Context, ph PipelineHandler, ds []Delivery, rs []BatchResult) error {
	b := &pgx.Batch{}
	if err := ph.QueueBatch(b, ds, rs); err != nil {
		return fmt.Errorf("queueing batch of %d deliveries: %w", len(ds), err)
	}
	if err := commitPipelined(ctx, c.pool, b); err != nil {
		return fmt.Errorf("applying batch of %d deliveries: %w", len(ds), err)
	}
	return nil
}

// commitPipelined sends BEGIN, the synchronous_commit guard, stmts's
// statements and COMMIT as one pipelined batch on a connection of pool,
// and reports whether the transaction committed (nil) or not. A connection
// left inside a transaction is rolled back, or closed.
func commitPipelined(ctx context.Context, pool *pgxpool.Pool, stmts *pgx.Batch) error {
	b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, len(stmts.QueuedQueries)+3)}
	b.Queue("BEGIN")
	b.Queue(guardSQL)
	b.QueuedQueries = append(b.QueuedQueries, stmts.QueuedQueries...)
	committed := false
	b.Queue("COMMIT").Exec(func(ct pgconn.CommandTag) error {
		if ct.String() != "COMMIT" {
			// A failed transaction answers COMMIT with ROLLBACK.
			return fmt.Errorf("inbox transaction ended in %q", ct.String())
		}
		committed = true
		return nil
	})
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("beginning inbox transaction: %w", err)
	}
	// Release destroys a connection left inside a transaction.
	defer conn.Release()
	err = conn.SendBatch(ctx, b).Close()
	if err == nil && committed {
		return nil
	}
	if conn.Conn().PgConn().TxStatus() != 'I' {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		if _, rerr := conn.Exec(rctx, "ROLLBACK"); rerr != nil {
			_ = conn.Conn().Close(rctx)
		}
		cancel()
	}
	if err == nil {
		err = errors.New("inbox transaction not committed")
	}
	return err
}

// applyTx runs ds through the Handler in a pgx.Tx and commits it.
func (c *Consumer) applyTx(ctx context.Context, ds []Delivery) (results []result, err error) {
	tx, err := c.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: beginSQL})
	if err != nil {
		return nil, fmt.Errorf("beginning inbox transaction: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(ctx) // the error that made us roll back is the one to report
		}
	}()
	results = make([]result, 0, len(ds))
	if bh, ok := c.h.(BatchHandler); ok {
		if results, err = c.applyBatch(ctx, tx, bh, ds); err != nil {
			return nil, err
		}
		ds = nil // all handled
	}
	for _, d := range ds {
		if d.Err != nil { // the Source could not read it: never reaches the Handler
			results = append(results, result{d: d, outcome: outcomeDead, reason: d.Err.Error()})
			continue
		}
		fresh, err := c.h.Apply(ctx, tx, d)
		switch {
		case err == nil && fresh:
			results = append(results, result{d: d, outcome: outcomeApplied})
		case err == nil:
			results = append(results, result{d: d, outcome: outcomeDuplicate})
		case errors.Is(err, ErrMalformed):
			results = append(results, result{d: d, outcome: outcomeDead, reason: err.Error()})
		default:
			return nil, fmt.Errorf("applying delivery %s (ref %s): %w", d.ID, d.Ref, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("committing inbox transaction: %w", err)
	}
	return results, nil
}

// applyBatch is apply's loop for a BatchHandler: deliveries the Source
// could not read are dead-lettered, the rest go to ApplyBatch at once.
func (c *Consumer) applyBatch(ctx context.Context, tx pgx.Tx, bh BatchHandler, ds []Delivery) ([]result, error) {
	results, todo := splitUnreadable(ds)
	if len(todo) == 0 {
		return results, nil
	}
	rs, err := bh.ApplyBatch(ctx, tx, todo)
	if err != nil {
		return nil, fmt.Errorf("applying batch of %d deliveries: %w", len(todo), err)
	}
	more, err := classify(todo, rs)
	if err != nil {
		return nil, err
	}
	return appendResults(results, more), nil
}

// splitUnreadable sets aside the deliveries the Source could not read (to
// be dead-lettered) and returns the rest, for the handler. When every
// delivery is readable (the usual batch) it returns ds itself and no
// results: nothing is copied.
func splitUnreadable(ds []Delivery) (results []result, todo []Delivery) {
	if !slices.ContainsFunc(ds, func(d Delivery) bool { return d.Err != nil }) {
		return nil, ds
	}
	results = make([]result, 0, len(ds))
	todo = make([]Delivery, 0, len(ds))
	for _, d := range ds {
		if d.Err != nil {
			results = append(results, result{d: d, outcome: outcomeDead, reason: d.Err.Error()})
			continue
		}
		todo = append(todo, d)
	}
	return results, todo
}

// appendResults is append(results, more...) without the copy when results
// is empty (no unreadable delivery).
func appendResults(results, more []result) []result {
	if len(results) == 0 {
		return more
	}
	return append(results, more...)
}

// classify turns a batch handler's results for todo into outcomes; an Err
// that is not ErrMalformed fails the batch.
func classify(todo []Delivery, rs []BatchResult) ([]result, error) {
	if len(rs) != len(todo) {
		return nil, fmt.Errorf("applying batch: handler returned %d results for %d deliveries", len(rs), len(todo))
	}
	results := make([]result, 0, len(rs))
	for i, r := range rs {
		switch {
		case r.Err != nil && errors.Is(r.Err, ErrMalformed):
			results = append(results, result{d: todo[i], outcome: outcomeDead, reason: r.Err.Error()})
		case r.Err != nil:
			return nil, fmt.Errorf("applying delivery %s (ref %s): %w", todo[i].ID, todo[i].Ref, r.Err)
		case r.Fresh:
			results = append(results, result{d: todo[i], outcome: outcomeApplied, value: r.Value})
		default:
			results = append(results, result{d: todo[i], outcome: outcomeDuplicate})
		}
	}
	return results, nil
}

func (c *Consumer) event(e Event) {
	if c.onEvent != nil {
		c.onEvent(e)
	}
}

// finish runs after the commit of results: counts, logs, acks the applied
// and duplicate deliveries, then dead-letters the rest. Ack and DeadLetter
// failures are logged, not returned: the entries stay pending and come back.
func (c *Consumer) finish(ctx context.Context, results []result) {
	refs := make([]string, 0, len(results))
	var applied, dups int
	var dead []result
	for _, r := range results {
		switch r.outcome {
		case outcomeApplied:
			applied++
			refs = append(refs, r.d.Ref)
		case outcomeDuplicate:
			dups++
			refs = append(refs, r.d.Ref)
			c.log.Info("duplicate skipped", "message_id", r.d.ID, "ref", r.d.Ref)
			c.event(Event{Kind: EventDuplicate, N: 1, MessageID: r.d.ID, Ref: r.d.Ref})
		case outcomeDead:
			dead = append(dead, r)
		}
	}
	c.applied.Add(int64(applied))
	c.dups.Add(int64(dups))
	if applied > 0 {
		c.event(Event{Kind: EventApplied, N: applied})
	}
	if len(refs) > 0 {
		if err := c.src.Ack(ctx, refs...); err != nil {
			c.log.Warn("ack failed after commit; the deliveries come back and are skipped as duplicates",
				"err", err, "deliveries", len(refs))
		}
	}
	for _, r := range dead {
		if err := c.src.DeadLetter(ctx, r.d, r.reason); errors.Is(err, ErrSettled) {
			c.log.Info("delivery to dead-letter already settled by another consumer", "message_id", r.d.ID, "ref", r.d.Ref)
			continue
		} else if err != nil {
			c.log.Warn("dead letter failed; the delivery comes back", "err", err,
				"message_id", r.d.ID, "ref", r.d.Ref)
			continue
		}
		c.deadLets.Add(1)
		c.event(Event{Kind: EventDeadLettered, N: 1, MessageID: r.d.ID, Ref: r.d.Ref, Reason: r.reason})
		c.log.Warn("delivery dead-lettered", "message_id", r.d.ID, "ref", r.d.Ref, "reason", r.reason)
	}
}
