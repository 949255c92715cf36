package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/internal/service"
	"github.com/outboxchat/outboxchat/outbox/internal/outboxsql"
)

// ErrInvalidEvent is wrapped by Writer.Enqueue when an Event lacks its ID or
// Name, its Payload is not valid JSON or its Headers break the limits (then
// ErrInvalidHeaders is wrapped too). Nothing is sent to the database, so
// the caller's transaction stays usable.
var ErrInvalidEvent = errors.New("invalid event")

// ErrAlreadyStarted is wrapped by Start on a Writer or Relay whose previous
// run has not fully stopped. It is internal/service's ErrAlreadyStarted, so
// errors.Is matches it for every service of the module.
var ErrAlreadyStarted = service.ErrAlreadyStarted

// DefaultNotifyTimeout bounds the Writer's post-commit pg_notify statement.
const DefaultNotifyTimeout = 2 * time.Second

// Event is one event to enqueue.
type Event struct {
	// ID is the idempotency key handed to the Publisher as Message.ID (for
	// the chat: the message UUID). Required.
	ID string
	// Name is the event name (Message.Event), e.g. "message.created".
	// Required.
	Name string
	// Payload is the JSON document stored as jsonb. Required, must be valid
	// JSON. The relay hands it to the Publisher in jsonb's normalized text
	// form (key order and whitespace may differ from the input).
	Payload []byte
	// Headers is optional metadata that travels with the event to the
	// receiver (Message.Headers, redisq's Job.Headers, inbox.Delivery.Headers):
	// a trace context, a tenant, a schema version. Within the limits of
	// CheckHeaders (MaxHeaders keys of MaxHeaderKeyBytes, values of
	// MaxHeaderValueBytes). Stored in the row's headers column (jsonb; NULL
	// when empty). Default nil: no headers.
	Headers map[string]string
}

// WakeMode selects how a Writer wakes the relay after an enqueue.
type WakeMode int

const (
	// WakeAfterCommit (the default, the fast mode): the caller calls
	// Writer.Committed after its transaction commits; the Writer's
	// background goroutine (see Writer.Start) coalesces these calls and runs
	// one `SELECT pg_notify(channel, '')` per burst on its pool. A wake-up lost
	// to a crash between commit and notify is caught by the relay's poll.
	WakeAfterCommit WakeMode = iota
	// WakeInTx (the write-up's mode): Enqueue runs pg_notify inside the
	// caller's transaction; PostgreSQL delivers it on commit and drops it on
	// rollback. Costs nothing extra to call, but every committing transaction
	// that has notified takes one database-wide lock while it queues its
	// notifications, so concurrent notifying commits are serialised.
	WakeInTx
	// WakeNone: no wake-up; the relay finds the rows by polling.
	WakeNone
)

// String returns "after_commit", "in_tx", "none" or "WakeMode(n)".
func (m WakeMode) String() string {
	switch m {
	case WakeAfterCommit:
		return "after_commit"
	case WakeInTx:
		return "in_tx"
	case WakeNone:
		return "none"
	}
	return fmt.Sprintf("WakeMode(%d)", int(m))
}

// ParseWakeMode parses a WakeMode from its String form ("after_commit",
// "in_tx", "none"); the spellings with '-' ("after-commit", "in-tx", the
// CLI's --wake values) are accepted too. Error: an unknown name.
func ParseWakeMode(s string) (WakeMode, error) {
	switch strings.ReplaceAll(s, "-", "_") {
	case "after_commit":
		return WakeAfterCommit, nil
	case "in_tx":
		return WakeInTx, nil
	case "none":
		return WakeNone, nil
	}
	return 0, fmt.Errorf("outbox: unknown wake mode %q (want after_commit, in_tx or none)", s)
}

// WriterConfig configures NewWriter. A nil *WriterConfig is invalid because
// Table has no default.
type WriterConfig struct {
	// Table is the outbox table, "ident" or "schema.ident" (lower case,
	// [a-z_][a-z0-9_]*). Required; create it with TableDDL.
	Table string
	// Channel is the NOTIFY channel. Default "": Table with '.' replaced by
	// '_' (the relay's default too).
	Channel string
	// Mode is the wake-up mode. Default WakeAfterCommit.
	Mode WakeMode
	// NotifyTimeout bounds each post-commit pg_notify (WakeAfterCommit).
	// Default 0 means DefaultNotifyTimeout (2 s).
	NotifyTimeout time.Duration
	// NotifyInterval is the least time between the starts of two
	// post-commit pg_notify calls (WakeAfterCommit): a Committed call
	// after a quiet spell notifies at once, calls within the interval are
	// coalesced into one notify at its end. Default 0: no spacing, one
	// notify per burst as soon as the previous one has finished — under
	// load about one per committed transaction, each a transaction of its
	// own that also wakes every listener. Set it when a relay in the same
	// process is woken directly (Relay.Wake) and the NOTIFY only serves
	// other processes, which then hear of new rows at most this much later
	// under sustained load (the chat sets 5 ms; its README gives the lab
	// bench figures).
	NotifyInterval time.Duration
	// Notifier, when set (WakeAfterCommit), sends this Writer's post-commit
	// notifies together with those of the other Writers that share it, one
	// statement for all of their channels (see Notifier); NotifyTimeout and
	// NotifyInterval are then the Notifier's, and this Writer's Start and
	// Stop leave it alone: its owner starts and stops it. Default nil: the
	// Writer sends its own.
	Notifier *Notifier
	// Logger receives notify failures (at Warn) with component=outbox.writer.
	// Default nil means slog.Default().
	Logger *slog.Logger
}

// Writer enqueues events into an outbox table inside the caller's
// transaction and wakes the relay. Create it with NewWriter. Enqueue and
// Committed are safe for concurrent use, and so are Start, Stop, Started
// and Stopped.
type Writer struct {
	channel string
	mode    WakeMode

	sql outboxsql.Writer

	// notifier sends the post-commit notifies (WakeAfterCommit): the
	// Writer's own, or a shared one (shared true) that the Writer does
	// not start or stop.
	notifier *Notifier
	shared   bool
	idle     service.Lifecycle // Started and Stopped in the other modes: never started

	// uncommitted is when (unix ns) the oldest Enqueue since the last
	// Committed ran, 0 when none did (WakeAfterCommit); warned is set once
	// the forgotten-Committed warning was logged.
	uncommitted atomic.Int64
	warned      atomic.Bool
	log         *slog.Logger
	forgetAfter time.Duration // forgetCommittedAfter (tests shorten it)
}

// forgetCommittedAfter is how long Enqueue calls may go without a
// Committed before the Writer warns (once) that the caller seems to forget
// it: longer than the relay's default poll, which such events then wait for.
const forgetCommittedAfter = 2 * time.Second

// enqueued notes an Enqueue in WakeAfterCommit mode, and warns once when
// none of the Enqueues of the last forgetCommittedAfter was followed by a
// Committed.
func (w *Writer) enqueued() {
	if w.notifier == nil {
		return
	}
	now := time.Now().UnixNano()
	if w.uncommitted.CompareAndSwap(0, now) {
		return
	}
	if old := w.uncommitted.Load(); old != 0 && now-old > int64(w.forgetAfter) && w.warned.CompareAndSwap(false, true) {
		w.log.Warn("outbox: events enqueued for 2 s without a Committed call: with WakeAfterCommit call Writer.Committed after each commit (or use Writer.InTx), or every event waits for the relay's poll; a rolled-back transaction needs none (logged once)",
			slog.String("channel", w.channel))
	}
}

// WithDefaults returns a copy of c in which every zero field holds its
// default: Channel from Table, NotifyTimeout DefaultNotifyTimeout, Logger
// slog.Default() (Mode's zero value is WakeAfterCommit; NotifyInterval's
// is no spacing). Negative values are kept (NewWriter rejects them). A nil c
// gives a config of defaults without Table.
func (c *WriterConfig) WithDefaults() *WriterConfig {
	d := *cmp.Or(c, &WriterConfig{})
	d.Channel = defaultChannel(d.Channel, d.Table)
	d.NotifyTimeout = cmp.Or(d.NotifyTimeout, DefaultNotifyTimeout)
	d.Logger = cmp.Or(d.Logger, slog.Default())
	return &d
}

// validate checks a config that went through WithDefaults for pool and
// returns its parsed Table. Errors wrap ErrInvalidConfig.
func (c *WriterConfig) validate(pool *pgxpool.Pool) (outboxsql.Table, error) {
	t, err := parseTable(c.Table)
	if err != nil {
		return outboxsql.Table{}, err
	}
	if err := checkChannel(c.Channel); err != nil {
		return outboxsql.Table{}, err
	}
	switch c.Mode {
	case WakeAfterCommit:
		if pool == nil {
			return outboxsql.Table{}, fmt.Errorf("pool is required for WakeAfterCommit: %w", ErrInvalidConfig)
		}
	case WakeInTx, WakeNone:
	default:
		return outboxsql.Table{}, fmt.Errorf("unknown mode %v: %w", c.Mode, ErrInvalidConfig)
	}
	return t, checkNotNegative("NotifyTimeout NotifyInterval", c.NotifyTimeout, c.NotifyInterval)
}

// NewWriter validates cfg (after WithDefaults) and returns a Writer. pool is
// used only for the post-commit notifications of WakeAfterCommit and may be
// nil in the other modes. Errors wrap ErrInvalidConfig: a nil cfg, a bad
// Table or Channel, an unknown Mode, a nil pool with WakeAfterCommit, a
// negative duration.
func NewWriter(pool *pgxpool.Pool, cfg *WriterConfig) (*Writer, error) {
	if cfg == nil {
		return nil, fmt.Errorf("outbox: new writer: config with Table is required: %w", ErrInvalidConfig)
	}
	cfg = cfg.WithDefaults()
	t, err := cfg.validate(pool)
	if err != nil {
		return nil, fmt.Errorf("outbox: new writer: %w", err)
	}
	w := &Writer{channel: cfg.Channel, mode: cfg.Mode, idle: service.Lifecycle{Name: "outbox: writer"}, log: cfg.Logger,
		forgetAfter: forgetCommittedAfter}
	if cfg.Mode == WakeAfterCommit {
		w.notifier, w.shared = cfg.Notifier, cfg.Notifier != nil
		if !w.shared {
			w.notifier = newNotifier(pool, cfg.NotifyTimeout, cfg.NotifyInterval, cfg.Logger)
		}
	}
	w.sql = t.Writer()
	return w, nil
}

// Channel returns the NOTIFY channel this Writer notifies.
func (w *Writer) Channel() string { return w.channel }

// Mode returns the Writer's wake-up mode.
func (w *Writer) Mode() WakeMode { return w.mode }

// Enqueue inserts events into the outbox inside tx with one INSERT (one
// round trip; two statements pipelined in one round trip with WakeInTx, the
// second being pg_notify). It never commits or rolls back tx: the events
// become visible to the relay when the caller commits, and vanish if it rolls
// back. With WakeAfterCommit call Committed after the commit (InTx does;
// a Writer whose Enqueues go 2 s without one logs a warning, once). Zero events is
// a no-op. Events are published in the order given.
//
// Errors are wrapped "outbox: enqueue: ...". An invalid Event wraps
// ErrInvalidEvent and is detected before anything is sent, leaving tx usable;
// a database error leaves tx aborted, as any failed statement does.
// Safe for concurrent use (on different transactions).
func (w *Writer) Enqueue(ctx context.Context, tx pgx.Tx, events ...Event) error {
	if len(events) == 0 {
		return nil
	}
	sql, args, err := w.insert(events)
	if err != nil {
		return err
	}
	if w.mode != WakeInTx {
		if _, err := tx.Exec(ctx, sql, args...); err != nil {
			return fmt.Errorf("outbox: enqueue: insert: %w", err)
		}
		w.enqueued()
		return nil
	}
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	b.Queue(outboxsql.Notify, w.channel)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("outbox: enqueue: insert and notify: %w", err)
	}
	return nil
}

// QueueEnqueue is Enqueue for a caller that pipelines its statements: it
// validates events exactly as Enqueue does and queues the same INSERT (and,
// with WakeInTx, the pg_notify) onto b, to be sent inside the caller's
// transaction — typically with the caller's COMMIT queued right after, so
// the events ride on the commit's round trip. The caller must read (or
// Close) b's results and check that the COMMIT's command tag is "COMMIT".
// It returns the number of statements queued (0 for no events, 1 or 2);
// on error (wrapping ErrInvalidEvent) nothing is queued. Safe for
// concurrent use on distinct batches.
func (w *Writer) QueueEnqueue(b *pgx.Batch, events ...Event) (int, error) {
	if len(events) == 0 {
		return 0, nil
	}
	sql, args, err := w.insert(events)
	if err != nil {
		return 0, err
	}
	b.Queue(sql, args...)
	w.enqueued()
	if w.mode != WakeInTx {
		return 1, nil
	}
	b.Queue(outboxsql.Notify, w.channel)
	return 2, nil
}

// insert validates events and returns the INSERT for them.
func (w *Writer) insert(events []Event) (string, []any, error) {
	for i, e := range events {
		switch {
		case e.ID == "":
			return "", nil, fmt.Errorf("outbox: enqueue: event %d: empty ID: %w", i, ErrInvalidEvent)
		case e.Name == "":
			return "", nil, fmt.Errorf("outbox: enqueue: event %d (id %s): empty Name: %w", i, e.ID, ErrInvalidEvent)
		case !json.Valid(e.Payload):
			return "", nil, fmt.Errorf("outbox: enqueue: event %d (id %s): payload is not valid JSON: %w", i, e.ID, ErrInvalidEvent)
		}
		if err := CheckHeaders(e.Headers); err != nil {
			return "", nil, fmt.Errorf("outbox: enqueue: event %d (id %s): %w: %w", i, e.ID, ErrInvalidEvent, err)
		}
	}
	if len(events) == 1 {
		e := events[0]
		return w.sql.InsertOne, []any{e.Name, e.ID, string(e.Payload), outboxsql.Headers(e.Headers)}, nil
	}
	names := make([]string, len(events))
	ids := make([]string, len(events))
	payloads := make([]string, len(events))
	headers := make([]*string, len(events))
	for i, e := range events {
		names[i], ids[i], payloads[i], headers[i] = e.Name, e.ID, string(e.Payload), outboxsql.Headers(e.Headers)
	}
	return w.sql.InsertMany, []any{names, ids, payloads, headers}, nil
}

// Committed tells the Writer that a transaction that called Enqueue has
// committed. With WakeAfterCommit it schedules one pg_notify, coalesced with
// every other call made before that notify starts; in other modes it does
// nothing. It never blocks. Calls made while the Writer is not started are
// remembered (one pending wake-up) and sent on Start; a wake-up that is never
// sent only delays publication until the relay's next poll.
// Safe for concurrent use.
func (w *Writer) Committed() {
	if w.notifier != nil {
		w.uncommitted.Store(0)
		w.notifier.Notify(w.channel)
	}
}

// InTx runs fn in a transaction begun on db (a pool, a connection, or a
// transaction for a savepoint: pgx.BeginFunc), commits it when fn returns
// nil (rolls back otherwise) and then calls Committed, so that the relay
// is woken without the caller having to remember it. fn enqueues with
// Enqueue(ctx, tx, …) beside its own writes. It returns fn's error, or the
// begin's or commit's (then Committed is not called: nothing was
// committed, or the outcome is unknown and the relay's poll covers it).
// Safe for concurrent use.
func (w *Writer) InTx(ctx context.Context, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, fn func(tx pgx.Tx) error) error {
	if err := pgx.BeginFunc(ctx, db, fn); err != nil {
		return err
	}
	w.Committed()
	return nil
}

// Start starts the background notifier of WakeAfterCommit (in other modes,
// and with a shared WriterConfig.Notifier, it starts nothing and returns
// nil). It does not block and follows the contract of internal/service:
// the notifier runs until Stop, or until ctx is cancelled (a hard stop).
// Errors: ErrAlreadyStarted while a run is in progress, or ctx.Err() (both
// wrapped).
func (w *Writer) Start(ctx context.Context) error {
	if w.notifier == nil || w.shared {
		return nil
	}
	return w.notifier.Start(ctx)
}

// Stop stops the notifier: it sends no new notify, lets an in-flight one
// finish (bounded by NotifyTimeout) and waits for the goroutine. If ctx ends
// first the in-flight notify is cancelled (it is only a wake-up), Stop waits
// for the goroutine and returns ctx's error (wrapped). Idempotent; nil if
// not running (and with a shared Notifier, which its owner stops). Start
// may be called again afterwards.
func (w *Writer) Stop(ctx context.Context) error {
	if w.notifier == nil || w.shared {
		return nil
	}
	return w.notifier.Stop(ctx)
}

// Started returns a channel closed once the latest Start started the
// notifier (with a shared Notifier: once its owner started it; never closed
// in modes other than WakeAfterCommit).
func (w *Writer) Started() <-chan struct{} {
	if w.notifier == nil {
		return w.idle.Started()
	}
	return w.notifier.Started()
}

// Stopped returns a channel closed once the notifier of the latest run has
// returned (closed before the first Start).
func (w *Writer) Stopped() <-chan struct{} {
	if w.notifier == nil {
		return w.idle.Stopped()
	}
	return w.notifier.Stopped()
}
