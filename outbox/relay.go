package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/internal/backoff"
	"github.com/outboxchat/outboxchat/internal/notifier"
	"github.com/outboxchat/outboxchat/internal/service"
	"github.com/outboxchat/outboxchat/outbox/internal/claimfloor"
	"github.com/outboxchat/outboxchat/outbox/internal/outboxsql"
)

// Relay defaults. A zero RelayConfig field means the matching default.
const (
	// DefaultBatchSize is the maximum number of rows claimed per pass.
	DefaultBatchSize = 100
	// DefaultPollInterval is how long the relay waits without a wake-up
	// before it looks at the table anyway.
	DefaultPollInterval = time.Second
	// DefaultPublishTimeout is the deadline given to Publisher.Publish.
	DefaultPublishTimeout = 2 * time.Second
	// DefaultLockTimeout is the relay transactions' lock_timeout.
	DefaultLockTimeout = 2 * time.Second
	// DefaultStatementTimeout is the relay transactions' statement_timeout.
	DefaultStatementTimeout = 5 * time.Second
	// DefaultIdleInTxTimeout is the relay transactions'
	// idle_in_transaction_session_timeout.
	DefaultIdleInTxTimeout = 5 * time.Second
	// DefaultListenApplicationName is the application_name of the relay's
	// LISTEN connection when the pool's config sets none.
	DefaultListenApplicationName = "outbox_relay_listen"
	// DefaultMaxAttempts is RelayConfig.MaxAttempts's default: a row whose
	// publish failed this many times by its own fault (MessageError) is
	// parked.
	DefaultMaxAttempts = 10
	// DefaultRetryBackoff and DefaultRetryBackoffMax bound the pause
	// before a row that failed by its own fault is tried again: the first
	// pause is DefaultRetryBackoff (50 ms), each further failure doubles
	// it, up to DefaultRetryBackoffMax (1 s). With DefaultMaxAttempts the
	// row holds the relay back for about 5.5 s in all before it is parked
	// (50+100+200+400+800 ms, then 4 × 1 s).
	DefaultRetryBackoff    = 50 * time.Millisecond
	DefaultRetryBackoffMax = time.Second
)

// Internal tunables (not configurable).
const (
	errBackoffMin    = 50 * time.Millisecond // first pause after a failed pass
	errBackoffMax    = time.Second           // cap of the doubling pause
	listenBackoffMin = 50 * time.Millisecond // first pause before a LISTEN reconnect
	listenBackoffMax = time.Second           // cap of the reconnect pause, at most the poll interval (NewRelay)
	listenConnectMax = 5 * time.Second       // bound on connect + LISTEN
	listenPingEvery  = 30 * time.Second      // health check of an idle LISTEN connection
	listenPingMax    = 5 * time.Second       // bound on that health check
	recordMax        = 2 * time.Second       // bound on recording a failure
	lastErrorMax     = 1000                  // bytes of last_error kept
)

// RelayEventKind names a typed event of the relay (RelayEvent.Kind). The values are
// stable strings, so a program can log them for another to read (the chat
// lab does).
type RelayEventKind string

// Relay event kinds.
const (
	// EventClaimed: a pass claimed N ≥ 1 unsent rows (before publishing).
	EventClaimed RelayEventKind = "outbox.claimed"
	// EventPublished: a pass published N ≥ 1 rows, marked them sent and
	// committed; Duration is the pass, claim to commit.
	EventPublished RelayEventKind = "outbox.published"
	// EventPassFailed: a pass failed at Stage ("claim", "publish",
	// "mark_sent"); Err is what RunOnce returned; its rows stay unsent.
	EventPassFailed RelayEventKind = "outbox.pass_failed"
	// EventListenUp: the LISTEN connection is up (after every reconnect).
	EventListenUp RelayEventKind = "outbox.listen_up"
	// EventListenDown: the LISTEN connection failed or was lost (Err), or
	// closed on stop (Err nil); the poll covers the gap.
	EventListenDown RelayEventKind = "outbox.listen_down"
	// EventMessageFailed: the Publisher blamed one row (a MessageError):
	// RowID, MessageID, Attempts (its failures so far, ≥ 1) and Err; the
	// rows before it were published and deleted, it waits Duration before
	// it is tried again, holding back the rows behind it.
	EventMessageFailed RelayEventKind = "outbox.message_failed"
	// EventParked: a row reached MaxAttempts failures of its own and was
	// parked (RowID, MessageID, Attempts, Err): no longer claimed, it no
	// longer holds back the rows behind it; see Parked and Retry.
	EventParked RelayEventKind = "outbox.parked"
)

// RelayEvent is one typed event of the relay, given to RelayConfig.OnEvent.
type RelayEvent struct {
	Kind RelayEventKind
	// N is the number of rows (EventClaimed, EventPublished).
	N int
	// Duration is the pass's duration (EventPublished).
	Duration time.Duration
	// Stage is where a pass failed (EventPassFailed).
	Stage string
	// Err is the failure (EventPassFailed, EventListenDown,
	// EventMessageFailed, EventParked).
	Err error
	// RowID, MessageID (the idempotency key) and Attempts (failures of
	// the row's own, ≥ 1) name the row of EventMessageFailed and
	// EventParked.
	RowID     int64
	MessageID string
	Attempts  int
	// Trigger is what started the pass (EventClaimed, EventPublished): a
	// NOTIFY, a Relay.Wake, the LISTEN connection's (re)connect, the poll,
	// or the end of a row's retry backoff; "" for a pass run by RunOnce.
	// Passes that follow a full batch carry the trigger of the first.
	Trigger WakeTrigger
}

// WakeTrigger names what started a relay pass (RelayEvent.Trigger). A relay
// whose deliveries are mostly TriggerPoll is not being woken: its LISTEN
// connection is down or its writers do not notify.
type WakeTrigger string

// Wake triggers.
const (
	// TriggerNotify: a NOTIFY on the relay's channel (a Writer's commit in
	// some process).
	TriggerNotify WakeTrigger = "notify"
	// TriggerWake: Relay.Wake (the caller's own commit, woken directly),
	// or Start's first pass.
	TriggerWake WakeTrigger = "wake"
	// TriggerCatchUp: the LISTEN connection came (back) up; the pass
	// catches up on what was committed while nobody listened.
	TriggerCatchUp WakeTrigger = "catch_up"
	// TriggerPoll: PollInterval passed without a wake-up.
	TriggerPoll WakeTrigger = "poll"
	// TriggerRetry: a row's retry backoff (RetryBackoff) ran out.
	TriggerRetry WakeTrigger = "retry"
)

// Wake-up causes pending for the next pass (Relay.wakeBy), most specific
// first: a pass woken by several carries the first one's trigger.
const (
	wakeByWake uint32 = 1 << iota
	wakeByNotify
	wakeByCatchUp
)

// triggerOf names a pending set of wake-up causes; last when it is empty
// (its cause was taken by the pass before, which ran after the wake-up).
func triggerOf(bits uint32, last WakeTrigger) WakeTrigger {
	switch {
	case bits&wakeByWake != 0:
		return TriggerWake
	case bits&wakeByNotify != 0:
		return TriggerNotify
	case bits&wakeByCatchUp != 0:
		return TriggerCatchUp
	}
	return cmp.Or(last, TriggerWake)
}

// RelayConfig configures NewRelay. Publisher and Table are required, so a nil
// *RelayConfig is invalid.
type RelayConfig struct {
	// Table is the outbox table, "ident" or "schema.ident" (lower case,
	// [a-z_][a-z0-9_]*). Required.
	Table string
	// Channel is the LISTEN channel. Default "": Table with '.' replaced by
	// '_' (the Writer's default too).
	Channel string
	// Publisher receives each claimed batch. Required.
	Publisher Publisher
	// BatchSize is the maximum number of rows claimed per pass. Default 0
	// means DefaultBatchSize (100).
	BatchSize int
	// PollInterval is the fallback poll period: the relay runs a pass when
	// it has had no wake-up for this long. Default 0 means
	// DefaultPollInterval (1 s).
	PollInterval time.Duration
	// DisableListen turns LISTEN off: the relay only polls (and reacts to
	// Relay.Wake). Default false.
	DisableListen bool
	// Notifier, when set, is the process's shared LISTEN connection
	// (internal/notifier): the relay subscribes
	// to Channel on it while started and does not open a connection of its
	// own. The caller starts and stops it. Default nil: the relay runs a
	// notifier of its own on a dedicated connection (application_name
	// DefaultListenApplicationName unless the pool's config sets one).
	Notifier *notifier.Notifier
	// SkipOwnNotifications drops the notifications sent by this process's
	// own connections, as Notifier's Config.Own tells them (a relay woken
	// directly by its own process's sends). Needs Notifier. Default false.
	SkipOwnNotifications bool
	// IgnoreNotification, when set, is asked about every notification on
	// the channel with the PID of the backend that sent it; true drops it
	// (no pass). For a relay whose own process wakes it directly after
	// each commit (Relay.Wake), its own notifications would only cause a
	// second, mostly empty pass: drop those (collect the PIDs of the
	// process's connections with pgxpool.Config.AfterConnect). Called from
	// the LISTEN goroutine; must not block. Default nil: every
	// notification wakes the relay.
	IgnoreNotification func(senderPID uint32) bool
	// PublishTimeout is the context deadline given to Publisher.Publish.
	// Default 0 means DefaultPublishTimeout (2 s).
	PublishTimeout time.Duration
	// LockTimeout, StatementTimeout and IdleInTxTimeout are set (as
	// transaction-local lock_timeout, statement_timeout and
	// idle_in_transaction_session_timeout, millisecond precision) in every
	// relay transaction, so that nothing it does while holding row locks can
	// hang. Defaults 0 mean DefaultLockTimeout (2 s), DefaultStatementTimeout
	// (5 s) and DefaultIdleInTxTimeout (5 s). IdleInTxTimeout should exceed
	// PublishTimeout.
	LockTimeout      time.Duration
	StatementTimeout time.Duration
	IdleInTxTimeout  time.Duration
	// Logger receives pass failures (Warn) and LISTEN state changes (Info,
	// Warn) with component=outbox.relay. Default nil means slog.Default().
	Logger *slog.Logger
	// MaxAttempts is how many failures of its own (the Publisher returned
	// a MessageError naming it) a row may have before it is parked: parked
	// rows are not claimed, so they stop holding back the rows behind them,
	// and wait for Retry. Failures of a whole pass (broker down, timeout)
	// never count. Default 0 means DefaultMaxAttempts (10); negative means
	// never park (the row is retried with backoff for ever).
	MaxAttempts int
	// RetryBackoff is the pause after a row's first failure of its own;
	// it doubles with each further one up to RetryBackoffMax. While a row
	// waits, passes publish only the rows before it (order: nothing behind
	// it overtakes it). Defaults 0 mean DefaultRetryBackoff (50 ms) and
	// DefaultRetryBackoffMax (1 s).
	RetryBackoff, RetryBackoffMax time.Duration
	// OnEvent, when set, receives every typed Event of the relay (the app
	// feeds Prometheus and its event log from it). Called from the relay's
	// goroutines (and RunOnce's caller); must be cheap, must not block,
	// must be safe for concurrent use. Default nil.
	OnEvent func(RelayEvent)
	// Group, when set, shares this relay's passes with the Group's other
	// relays (see RelayGroup): passes that start while another member's is
	// in flight run together in the next one, one transaction for all.
	// It must have been made with the relay's pool. Default nil: every
	// pass is a transaction of its own.
	Group *RelayGroup
}

// Relay moves unsent outbox rows to a Publisher: claim (FOR UPDATE) in id
// order, publish, delete the published rows, commit; see the package doc for its invariants.
// Create it with NewRelay. RunOnce, Wake and Listening are safe for
// concurrent use; so are Start, Stop, Started and Stopped.
type Relay struct {
	pool      *pgxpool.Pool
	pub       Publisher
	channel   string
	batchSize int
	poll      time.Duration
	listen    bool
	ignore    func(uint32) bool
	notifier  *notifier.Notifier // shared (owned false) or the relay's own
	ownNotify bool               // the relay starts and stops notifier
	skipOwn   bool
	pubTO     time.Duration
	timeouts  [3]string // lock, statement, idle-in-tx, as "<n>ms"
	log       *slog.Logger
	onEvent   func(RelayEvent)

	maxAttempts            int
	backoffMin, backoffMax time.Duration
	lastPass               atomic.Int64 // unix nanoseconds of the last committed pass
	sql                    outboxsql.Relay
	table                  string // quoted table name, for outboxsql.Seq
	floor                  claimfloor.Floor

	wake       chan struct{} // 1-buffered pending wake-up
	wakeBy     atomic.Uint32 // what asked for it: wakeBy* bits
	listening  atomic.Bool
	subscribed atomic.Bool // the notifier subscription's callbacks act only while set

	group *RelayGroup
	rank  int64 // in group

	life service.Lifecycle
}

// WithDefaults returns a copy of c in which every zero field holds its
// default: Channel from Table, BatchSize DefaultBatchSize, PollInterval
// DefaultPollInterval, PublishTimeout DefaultPublishTimeout, the three
// transaction timeouts their Default constants, Logger slog.Default().
// Negative values are kept (NewRelay rejects them). A nil c gives a config
// of defaults without Table and Publisher.
func (c *RelayConfig) WithDefaults() *RelayConfig {
	d := *cmp.Or(c, &RelayConfig{})
	d.Channel = defaultChannel(d.Channel, d.Table)
	d.BatchSize = cmp.Or(d.BatchSize, DefaultBatchSize)
	d.PollInterval = cmp.Or(d.PollInterval, DefaultPollInterval)
	d.PublishTimeout = cmp.Or(d.PublishTimeout, DefaultPublishTimeout)
	d.LockTimeout = cmp.Or(d.LockTimeout, DefaultLockTimeout)
	d.StatementTimeout = cmp.Or(d.StatementTimeout, DefaultStatementTimeout)
	d.IdleInTxTimeout = cmp.Or(d.IdleInTxTimeout, DefaultIdleInTxTimeout)
	d.MaxAttempts = cmp.Or(d.MaxAttempts, DefaultMaxAttempts)
	d.RetryBackoff = cmp.Or(d.RetryBackoff, DefaultRetryBackoff)
	d.RetryBackoffMax = cmp.Or(d.RetryBackoffMax, DefaultRetryBackoffMax)
	d.Logger = cmp.Or(d.Logger, slog.Default())
	return &d
}

// validate checks a config that went through WithDefaults and returns its
// parsed Table. Errors wrap ErrInvalidConfig.
func (c *RelayConfig) validate() (outboxsql.Table, error) {
	if c.Publisher == nil {
		return outboxsql.Table{}, fmt.Errorf("RelayConfig.Publisher is required: %w", ErrInvalidConfig)
	}
	t, err := parseTable(c.Table)
	if err != nil {
		return outboxsql.Table{}, err
	}
	if err := checkChannel(c.Channel); err != nil {
		return outboxsql.Table{}, err
	}
	if c.BatchSize < 0 {
		return outboxsql.Table{}, fmt.Errorf("negative BatchSize: %w", ErrInvalidConfig)
	}
	return t, checkNotNegative("PollInterval PublishTimeout LockTimeout StatementTimeout IdleInTxTimeout RetryBackoff RetryBackoffMax",
		c.PollInterval, c.PublishTimeout, c.LockTimeout, c.StatementTimeout, c.IdleInTxTimeout, c.RetryBackoff, c.RetryBackoffMax)
}

// NewRelay validates cfg (after WithDefaults) and returns a stopped Relay.
// Errors wrap ErrInvalidConfig: a nil cfg or pool, no Publisher, a bad
// Table or Channel, a negative field, a Group made with another pool.
func NewRelay(pool *pgxpool.Pool, cfg *RelayConfig) (*Relay, error) {
	if cfg == nil {
		return nil, fmt.Errorf("outbox: new relay: config with Table and Publisher is required: %w", ErrInvalidConfig)
	}
	if pool == nil {
		return nil, fmt.Errorf("outbox: new relay: nil pool: %w", ErrInvalidConfig)
	}
	cfg = cfg.WithDefaults()
	t, err := cfg.validate()
	if err != nil {
		return nil, fmt.Errorf("outbox: new relay: %w", err)
	}
	if cfg.Group != nil && cfg.Group.pool != pool {
		return nil, fmt.Errorf("outbox: new relay: Group runs on another pool: %w", ErrInvalidConfig)
	}
	r := &Relay{
		pool:        pool,
		pub:         cfg.Publisher,
		channel:     cfg.Channel,
		batchSize:   cfg.BatchSize,
		poll:        cfg.PollInterval,
		listen:      !cfg.DisableListen,
		ignore:      cfg.IgnoreNotification,
		pubTO:       cfg.PublishTimeout,
		timeouts:    [3]string{pgMillis(cfg.LockTimeout), pgMillis(cfg.StatementTimeout), pgMillis(cfg.IdleInTxTimeout)},
		log:         cfg.Logger.With(slog.String("component", "outbox.relay")),
		maxAttempts: cfg.MaxAttempts,
		backoffMin:  cfg.RetryBackoff,
		backoffMax:  cfg.RetryBackoffMax,
		onEvent:     cfg.OnEvent,
		wake:        make(chan struct{}, 1),
		life:        service.Lifecycle{Name: "outbox: relay"},
		notifier:    cfg.Notifier,
		skipOwn:     cfg.SkipOwnNotifications,
		group:       cfg.Group,
	}
	if r.group != nil {
		r.rank = r.group.q.Join()
	}
	if r.listen && r.notifier == nil {
		n, err := notifier.New(&notifier.Config{
			ConnConfig: pool.Config().ConnConfig, ApplicationName: DefaultListenApplicationName,
			// Tried at least once per poll: past that, waiting only keeps
			// the relay on its poll after Postgres is back.
			ReconnectMin: listenBackoffMin, ReconnectMax: max(listenBackoffMin, min(listenBackoffMax, r.poll)), ConnectTimeout: listenConnectMax,
			PingEvery: listenPingEvery, PingTimeout: listenPingMax, Logger: cfg.Logger,
		})
		if err != nil {
			return nil, fmt.Errorf("outbox: new relay: %w", err)
		}
		r.notifier, r.ownNotify = n, true
	}

	r.table, r.sql = t.Quoted, t.Relay()
	return r, nil
}

// pgMillis renders d as a PostgreSQL duration setting in whole milliseconds
// (at least 1 ms; 0 would mean "no timeout").
func pgMillis(d time.Duration) string {
	ms := d.Milliseconds()
	if ms < 1 {
		ms = 1
	}
	return strconv.FormatInt(ms, 10) + "ms"
}

// Channel returns the channel the relay listens on.
func (r *Relay) Channel() string { return r.channel }

// Wake asks the running relay for a pass now. It never blocks; wake-ups
// coalesce (one pending at most), and one that arrives during a pass causes
// another pass. A wake-up given while stopped is kept for the next Start.
// Safe for concurrent use.
func (r *Relay) Wake() { r.wakeFor(wakeByWake) }

// wakeFor records why (a wakeBy* bit) and wakes the relay: the bit is set
// before the wake-up is left, so the pass that takes one finds its cause.
func (r *Relay) wakeFor(cause uint32) {
	r.wakeBy.Or(cause)
	wakeUp(r.wake)
}

// wakeUp leaves one wake-up pending on ch (1-buffered) unless one is.
func wakeUp(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Listening reports whether the LISTEN connection is currently established
// (always false with DisableListen or when stopped). Safe for concurrent use.
func (r *Relay) Listening() bool { return r.listening.Load() }

// RunOnce runs one pass (the package doc's Relay section: one transaction
// of two round trips besides Publish, which gets PublishTimeout and the
// claimed rows before the first one still waiting after a failure of its
// own) and returns the number of rows published (0 to BatchSize).
//
// When the Publisher returns a MessageError naming a claimed row, the rows
// before it count as published and are deleted, and the row gets one more
// failure, last_error and its backoff, or is parked at MaxAttempts
// (EventMessageFailed, EventParked, a log line naming it), all in the
// pass's transaction; RunOnce then returns the rows published and nil. On
// any other error it rolls back, so the rows stay unsent; if rows had been
// claimed it then records attempts+1 and last_error on them in a separate
// short transaction (best effort), and returns the error wrapped
// "outbox: relay: <stage>: ...". ctx cancels the pass. Safe for concurrent
// use, also while the relay is started (passes then serialise on the row
// locks).
func (r *Relay) RunOnce(ctx context.Context) (n int, err error) {
	p, err := r.runOnce(ctx, "")
	return p.n, err
}

// pass is what one pass did: n rows published; more when a row was parked
// (the rows behind it may be claimed at once); wait > 0 when the pass
// stopped at a row waiting after a failure of its own, for that long.
type pass struct {
	n    int
	more bool
	wait time.Duration
}

// LastPass returns when the latest pass committed (an empty one too), by
// this process's clock; zero before the first. Safe for concurrent use.
func (r *Relay) LastPass() time.Time {
	if ns := r.lastPass.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// runOnce runs one pass started by t (RelayEvent.Trigger).
func (r *Relay) runOnce(ctx context.Context, t WakeTrigger) (p pass, err error) {
	if r.group != nil {
		return r.group.pass(ctx, r, t)
	}
	start := time.Now()
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return p, r.fail("claim", fmt.Errorf("outbox: relay: claim: acquire connection: %w", err))
	}
	defer conn.Release() // destroys the connection if a transaction is left open

	inTx := false
	defer rollbackOpen(ctx, conn, &inTx)

	floor, wantXid := r.floor.Start(start)
	b := &pgx.Batch{}
	b.Queue(outboxsql.Seq, r.table)
	b.Queue("BEGIN")
	b.Queue(outboxsql.Snapshot)
	b.Queue(outboxsql.SetTimeouts, r.timeouts[0], r.timeouts[1], r.timeouts[2])
	b.Queue(r.sql.Claim, r.batchSize, floor)
	br := conn.SendBatch(ctx, b)
	inTx = true
	var h horizon
	claimed, waits, err := r.readClaim(br, &h)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return p, r.fail("claim", fmt.Errorf("outbox: relay: claim: %w", err))
	}
	c := r.account(claimed, waits)
	p.wait = c.wait
	if len(c.msgs) == 0 {
		if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
			return p, r.fail("claim", fmt.Errorf("outbox: relay: claim: commit empty pass: %w", err))
		}
		inTx = false
		r.emptyPassDone(floor, h, c)
		return p, nil
	}
	r.event(RelayEvent{Kind: EventClaimed, N: len(c.msgs), Trigger: t})
	pub := r.publish(ctx, c.msgs)
	if pub.err != nil {
		r.rollbackAndRecord(ctx, conn, &inTx, c.ids, pub.err)
		return pass{}, r.fail("publish", pub.err)
	}
	c.blame(pub)
	b = &pgx.Batch{}
	r.queueMark(b, c, pub)
	if wantXid {
		// The xid the claim's row locks gave this transaction, after the
		// sequence read: the floor's R (internal/claimfloor).
		b.Queue(outboxsql.Xid)
	}
	b.Queue("COMMIT")
	br = conn.SendBatch(ctx, b)
	m, err := r.readMark(br, pub)
	var xid int64
	if err == nil && wantXid {
		err = br.QueryRow().Scan(&xid)
	}
	if err == nil {
		err = readCommit(br)
	}
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		err = fmt.Errorf("outbox: relay: mark %d rows sent: %w", len(c.ids), err)
		r.rollbackAndRecord(ctx, conn, &inTx, c.ids, err)
		return pass{}, r.fail("mark_sent", err)
	}
	inTx = false
	return r.passDone(start, t, floor, h, xid, c, pub, m), nil
}

// claim is what a pass does with the rows its claim returned: it publishes
// msgs (the rows before the first one still waiting after a failure of its
// own: nothing behind it overtakes it) and deletes ids. The floor may then
// move past lastID, the last row the pass accounts for, and past the end of
// the claim when full (a full claim, or one cut short).
type claim struct {
	msgs   []Message
	ids    []int64
	wait   time.Duration // > 0: the pass stopped at a row waiting this long
	full   bool
	lastID int64
}

// account turns a claim's rows and their waits into what the pass
// publishes.
func (r *Relay) account(claimed []Message, waits []time.Duration) claim {
	c := claim{msgs: claimed, full: len(claimed) == r.batchSize}
	for i, w := range waits {
		if w > 0 {
			c.msgs, c.wait = claimed[:i], w
			c.full, c.lastID = true, claimed[i].RowID-1
			break
		}
	}
	if c.wait == 0 && len(claimed) > 0 {
		c.lastID = claimed[len(claimed)-1].RowID
	}
	c.ids = make([]int64, len(c.msgs))
	for i, m := range c.msgs {
		c.ids[i] = m.RowID
	}
	return c
}

// published is the outcome of a pass's Publish: err for a failure of the
// whole call (nothing counts as published), or the row the Publisher blamed
// (k ≥ 0, poison): the rows before it were published.
type published struct {
	err    error
	k      int
	poison *MessageError
}

// publish hands msgs to the Publisher under PublishTimeout.
func (r *Relay) publish(ctx context.Context, msgs []Message) published {
	pctx, cancel := context.WithTimeout(ctx, r.pubTO)
	err := r.pub.Publish(pctx, msgs)
	cancel()
	p := published{k: -1}
	if err != nil && errors.As(err, &p.poison) {
		p.k = slices.IndexFunc(msgs, func(m Message) bool { return m.RowID == p.poison.RowID })
	}
	if err != nil && p.k < 0 {
		p.err = fmt.Errorf("outbox: relay: publish %d rows: %w", len(msgs), err)
	}
	return p
}

// blame narrows c to the rows published before a blamed row: only those
// are deleted, and the floor stops before the blamed row.
func (c *claim) blame(p published) {
	if p.k >= 0 {
		c.ids = c.ids[:p.k]
		c.full, c.lastID = true, p.poison.RowID-1
	}
}

// queueMark queues the deletion of c's published rows and, for a blamed
// row, its failure (outboxsql.Relay.Fail).
func (r *Relay) queueMark(b *pgx.Batch, c claim, p published) {
	b.Queue(r.sql.Mark, c.ids)
	if p.k >= 0 {
		b.Queue(r.sql.Fail, p.poison.RowID, lastError(p.poison.Err), r.backoffMin.Milliseconds(),
			r.backoffMax.Milliseconds(), r.maxAttempts)
	}
}

// marked is what the Fail statement returned for a blamed row.
type marked struct {
	failures int
	parked   bool
}

// readMark reads the results of queueMark's statements.
func (r *Relay) readMark(br pgx.BatchResults, p published) (m marked, err error) {
	if _, err = br.Exec(); err == nil && p.k >= 0 {
		err = br.QueryRow().Scan(&m.failures, &m.parked)
	}
	return m, err
}

// readCommit reads a COMMIT's result: a failed transaction answers it with
// ROLLBACK.
func readCommit(br pgx.BatchResults) error {
	tag, err := br.Exec()
	if err == nil && tag.String() != "COMMIT" {
		err = fmt.Errorf("commit ended in %q", tag.String())
	}
	return err
}

// emptyPassDone records a committed pass that published nothing.
func (r *Relay) emptyPassDone(floor int64, h horizon, c claim) {
	r.lastPass.Store(time.Now().UnixNano())
	r.floor.Advance(floor, h.v, h.xmin, 0, c.full, c.lastID)
}

// passDone records a committed pass that published rows (its xid when it
// read one, for the floor) and reports its events.
func (r *Relay) passDone(start time.Time, t WakeTrigger, floor int64, h horizon, xid int64, c claim, pub published, m marked) (p pass) {
	p.wait = c.wait
	r.lastPass.Store(time.Now().UnixNano())
	if old := r.floor.Advance(floor, h.v, h.xmin, xid, c.full, c.lastID); floor == 0 && c.msgs[0].RowID < old && pub.k != 0 {
		r.log.Warn("published a row below the claim floor; an outbox writer breaks the floor's assumptions (explicit ids, sequence CACHE > 1?): order across such rows is not guaranteed",
			slog.Int64("row_id", c.msgs[0].RowID), slog.Int64("floor", old))
	}
	p.n = len(c.ids)
	if pub.k >= 0 {
		bad := c.msgs[pub.k]
		e := RelayEvent{Kind: EventMessageFailed, RowID: bad.RowID, MessageID: bad.ID, Attempts: m.failures, Err: pub.poison.Err}
		if m.parked {
			// The rows behind it can go at once.
			e.Kind, p.more, p.wait = EventParked, true, 0
			r.log.Error("parked an outbox row: its publish failed too often; the rows behind it go on, it waits for a retry",
				slog.Int64("row_id", bad.RowID), slog.String("message_id", bad.ID), slog.Int("attempts", m.failures),
				slog.Any("err", pub.poison.Err))
		} else {
			p.wait = backoff.Delay(r.backoffMin, r.backoffMax, m.failures-1)
			e.Duration = p.wait
			r.log.Warn("publishing an outbox row failed; it holds back the rows behind it until it is published or parked",
				slog.Int64("row_id", bad.RowID), slog.String("message_id", bad.ID), slog.Int("attempts", m.failures),
				slog.Int("max_attempts", r.maxAttempts), slog.Duration("retry_in", p.wait), slog.Any("err", pub.poison.Err))
		}
		r.event(e)
	}
	if p.n > 0 {
		r.event(RelayEvent{Kind: EventPublished, N: p.n, Duration: time.Since(start), Trigger: t})
	}
	return p
}

// horizon is what a pass read before its claim, for the claim floor: the
// sequence's last value v, then its snapshot's xmin.
type horizon struct{ v, xmin int64 }

// readClaim reads the results of the sequence read, BEGIN, the snapshot
// read (into h), set_config and the claim query.
func (r *Relay) readClaim(br pgx.BatchResults, h *horizon) ([]Message, []time.Duration, error) {
	if err := br.QueryRow().Scan(&h.v); err != nil {
		return nil, nil, fmt.Errorf("read sequence: %w", err)
	}
	if err := readTxStart(br, &h.xmin); err != nil {
		return nil, nil, err
	}
	return readRows(br)
}

// readTxStart reads the results of a pass's BEGIN, snapshot read (into
// xmin) and set_config.
func readTxStart(br pgx.BatchResults, xmin *int64) error {
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if err := br.QueryRow().Scan(xmin); err != nil {
		return fmt.Errorf("read snapshot: %w", err)
	}
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("set timeouts: %w", err)
	}
	return nil
}

// readRows reads the rows of a claim query and how long each still waits.
func readRows(br pgx.BatchResults) ([]Message, []time.Duration, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, nil, err
	}
	var msgs []Message
	var waits []time.Duration
	for rows.Next() {
		var m Message
		var wait float64
		if err := rows.Scan(&m.RowID, &m.ID, &m.Event, &m.Payload, &m.CreatedAt, &m.Headers, &wait); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("scan: %w", err)
		}
		msgs = append(msgs, m)
		waits = append(waits, time.Duration(wait*float64(time.Second)))
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	return msgs, waits, nil
}

// rollbackAndRecord rolls back the pass's transaction and then, best effort,
// records the failure on the claimed rows in a short transaction of its own.
func (r *Relay) rollbackAndRecord(ctx context.Context, conn *pgxpool.Conn, inTx *bool, ids []int64, cause error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordMax)
	defer cancel()
	*inTx = false
	if !rollback(rctx, conn) {
		// The connection is gone; record on a fresh one.
		c2, err := r.pool.Acquire(rctx)
		if err != nil {
			return
		}
		defer c2.Release()
		conn = c2
	}
	msg := lastError(cause)
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(outboxsql.SetTimeouts, r.timeouts[0], r.timeouts[1], r.timeouts[2])
	b.Queue(r.sql.Record, ids, msg)
	b.Queue("COMMIT")
	if err := conn.SendBatch(rctx, b).Close(); err != nil {
		r.log.Debug("recording a failed pass failed", slog.Int("rows", len(ids)), slog.Any("err", err))
		_, _ = conn.Exec(rctx, "ROLLBACK")
	}
}

// rollbackOpen rolls back conn's transaction when *inTx says one is still
// open (a pass that returned early), within recordMax.
func rollbackOpen(ctx context.Context, conn *pgxpool.Conn, inTx *bool) {
	if *inTx {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordMax)
		rollback(rctx, conn)
		cancel()
	}
}

// rollback rolls back conn's transaction; a connection that cannot is
// closed (the pool drops it on Release) and rollback returns false.
func rollback(ctx context.Context, conn *pgxpool.Conn) bool {
	if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
		_ = conn.Conn().Close(ctx)
		return false
	}
	return true
}

// lastError renders err for the last_error column: at most lastErrorMax
// bytes of valid UTF-8 without NUL (text columns reject both).
func lastError(err error) string {
	msg := strings.ReplaceAll(err.Error(), "\x00", "")
	if len(msg) > lastErrorMax {
		msg = msg[:lastErrorMax]
	}
	return strings.ToValidUTF8(msg, "")
}

// fail reports a failed pass (EventPassFailed) and returns err.
func (r *Relay) fail(stage string, err error) error {
	r.event(RelayEvent{Kind: EventPassFailed, Stage: stage, Err: err})
	return err
}

func (r *Relay) event(e RelayEvent) {
	if r.onEvent != nil {
		r.onEvent(e)
	}
}

// Start starts the relay's loop (and, unless DisableListen, its LISTEN
// connection) and returns at once; the first pass runs immediately. It
// follows the contract of internal/service: it runs until Stop, or until ctx
// is cancelled (a hard stop that also cancels the in-flight pass; the rows
// then stay unsent). Errors: ErrAlreadyStarted while a run is in progress,
// or ctx.Err() (both wrapped).
func (r *Relay) Start(ctx context.Context) error {
	return r.life.Start(ctx, func(run *service.Run) {
		r.Wake()
		run.Go(func() {
			var unsubscribe func()
			if r.listen {
				r.subscribed.Store(true)
				unsubscribe = r.notifier.Subscribe(notifier.Subscription{
					Channel: r.channel, SkipOwn: r.skipOwn,
					Notify: r.onNotify, Up: r.onListenUp, Down: r.onListenDown,
				})
				if r.ownNotify {
					// Its run is this run's child: a hard stop ends it too.
					_ = r.notifier.Start(run.Context())
				}
			}
			r.loop(run.Context(), run.Stopping())
			// Stop order: no more passes, the in-flight one finished, then
			// the LISTEN connection is closed.
			if r.listen {
				unsubscribe()
				if r.ownNotify {
					_ = r.notifier.Stop(run.Context())
				}
				r.subscribed.Store(false)
				r.listening.Store(false)
			}
		})
	})
}

// Stop stops claiming, lets the in-flight pass finish (publish and commit),
// closes the LISTEN connection and waits for every goroutine. If ctx expires
// first, the in-flight pass is cancelled (its rows stay unsent), Stop still
// waits for the goroutines to return and then returns ctx's error (wrapped).
// Idempotent; nil if not running. Start may be called again afterwards.
func (r *Relay) Stop(ctx context.Context) error {
	return r.life.Stop(ctx)
}

// Started returns a channel closed once the latest Start succeeded.
func (r *Relay) Started() <-chan struct{} { return r.life.Started() }

// Stopped returns a channel closed once the latest run has fully stopped
// (closed before the first Start).
func (r *Relay) Stopped() <-chan struct{} { return r.life.Stopped() }

// loop runs passes on wake-ups and poll ticks until stopping is closed or
// ctx is cancelled.
func (r *Relay) loop(ctx context.Context, stopping <-chan struct{}) {
	poll := time.NewTimer(r.poll)
	defer poll.Stop()
	failed := 0 // passes failed in a row
	var trigger WakeTrigger
	timer := TriggerPoll // what the poll timer's firing means
	for {
		select {
		case <-stopping:
			return
		case <-ctx.Done():
			return
		case <-r.wake:
			trigger = triggerOf(r.wakeBy.Swap(0), trigger)
		case <-poll.C:
			trigger = timer
		}
		// Drain: keep passing while passes come back full (or parked a
		// row). A wake-up that arrives meanwhile sits in r.wake and causes
		// one more pass. A pass that stopped at a row waiting after a
		// failure of its own sets the next pass for when the wait ends.
		next := r.poll
		for {
			select {
			case <-stopping:
				return
			default:
			}
			p, err := r.runOnce(ctx, trigger)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				pause := backoff.Delay(errBackoffMin, errBackoffMax, failed)
				failed++
				r.log.Warn("pass failed; rows stay unsent for the next pass",
					slog.Any("err", err), slog.Duration("retry_in", pause))
				if !backoff.Sleep(ctx, stopping, pause) {
					return
				}
				continue
			}
			failed = 0
			if p.n < r.batchSize && !p.more {
				if p.wait > 0 {
					next = min(next, p.wait)
				}
				break
			}
		}
		timer = TriggerPoll
		if next < r.poll {
			timer = TriggerRetry
		}
		poll.Reset(next)
	}
}

// onNotify turns a notification into a Wake unless IgnoreNotification
// drops it. Called from the notifier's goroutine.
func (r *Relay) onNotify(_ string, pid uint32) {
	if !r.subscribed.Load() || (r.ignore != nil && r.ignore(pid)) {
		return
	}
	r.wakeFor(wakeByNotify)
}

// onListenUp runs after every (re)connect of the LISTEN connection: wake
// for a catch-up pass, because notifications sent while it was down are
// lost.
func (r *Relay) onListenUp() {
	if !r.subscribed.Load() {
		return
	}
	r.listening.Store(true)
	r.event(RelayEvent{Kind: EventListenUp})
	r.wakeFor(wakeByCatchUp)
}

// onListenDown runs when the LISTEN connection failed or was lost (err),
// or the notifier stopped (nil): the poll covers the gap.
func (r *Relay) onListenDown(err error) {
	if !r.subscribed.Load() {
		return
	}
	r.listening.Store(false)
	if err != nil {
		err = fmt.Errorf("outbox: relay: listen: %w", err)
	}
	r.event(RelayEvent{Kind: EventListenDown, Err: err})
}
