package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/internal/backoff"
	"github.com/outboxchat/outboxchat/internal/notifier"
	"github.com/outboxchat/outboxchat/internal/service"
	"github.com/outboxchat/outboxchat/outbox/internal/outboxsql"
	"github.com/outboxchat/outboxchat/outbox/internal/passloop"
	"github.com/outboxchat/outboxchat/outbox/internal/relaypass"
	"github.com/outboxchat/outboxchat/outbox/internal/wakeup"
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

// Wake-up causes pending for the next pass (Relay.wake), most specific
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
	// Linger is how long, under load, a woken pass waits after the start
	// of the previous one: when that drain published more than one row
	// (commits come faster than passes), the next woken drain begins only
	// Linger after it began, so each pass's fixed cost (claim, Publish,
	// delete, commit: two Postgres round trips and a broker call) is paid
	// for the rows committed meanwhile, as a producer's linger batches
	// sends. A wake-up after a drain of one row or none, or more than
	// Linger after the previous drain began, passes at once: an idle or
	// lightly loaded relay adds no delay, a busy one at most Linger.
	// Polls and retries never wait. Default 0: never wait (every wake-up
	// passes as soon as the previous drain ends). docs/PERFORMANCE.md
	// ("A relay that lingers under load") has the measured effect.
	Linger time.Duration
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
	poll      time.Duration
	linger    time.Duration
	listen    bool
	ignore    func(uint32) bool
	notifier  *notifier.Notifier // shared (owned false) or the relay's own
	ownNotify bool               // the relay starts and stops notifier
	skipOwn   bool
	pubTO     time.Duration
	log       *slog.Logger
	onEvent   func(RelayEvent)

	tbl relaypass.Table[Message] // the passes' table, floor and statements

	wake       *wakeup.Signal // causes: wakeBy* bits
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
	return t, checkNotNegative("PollInterval PublishTimeout LockTimeout StatementTimeout IdleInTxTimeout RetryBackoff RetryBackoffMax Linger",
		c.PollInterval, c.PublishTimeout, c.LockTimeout, c.StatementTimeout, c.IdleInTxTimeout, c.RetryBackoff, c.RetryBackoffMax, c.Linger)
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
		pool:     pool,
		pub:      cfg.Publisher,
		channel:  cfg.Channel,
		poll:     cfg.PollInterval,
		linger:   cfg.Linger,
		listen:   !cfg.DisableListen,
		ignore:   cfg.IgnoreNotification,
		pubTO:    cfg.PublishTimeout,
		log:      cfg.Logger.With(slog.String("component", "outbox.relay")),
		onEvent:  cfg.OnEvent,
		wake:     wakeup.New(),
		life:     service.Lifecycle{Name: "outbox: relay"},
		notifier: cfg.Notifier,
		skipOwn:  cfg.SkipOwnNotifications,
		group:    cfg.Group,
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

	r.tbl = relaypass.Table[Message]{
		Pool: pool, SQL: t.Relay(), Quoted: t.Quoted, BatchSize: cfg.BatchSize,
		Timeouts:    [3]string{relaypass.Millis(cfg.LockTimeout), relaypass.Millis(cfg.StatementTimeout), relaypass.Millis(cfg.IdleInTxTimeout)},
		MaxAttempts: cfg.MaxAttempts, BackoffMin: cfg.RetryBackoff, BackoffMax: cfg.RetryBackoffMax,
		Scan: scanMessage, RowID: func(m *Message) int64 { return m.RowID }, Log: r.log,
	}
	return r, nil
}

// Channel returns the channel the relay listens on.
func (r *Relay) Channel() string { return r.channel }

// Wake asks the running relay for a pass now. It never blocks; wake-ups
// coalesce (one pending at most), and one that arrives during a pass causes
// another pass. A wake-up given while stopped is kept for the next Start.
// Safe for concurrent use.
func (r *Relay) Wake() { r.wake.Wake(wakeByWake) }

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
func (r *Relay) LastPass() time.Time { return r.tbl.LastPass() }

// runOnce runs one pass started by t (RelayEvent.Trigger).
func (r *Relay) runOnce(ctx context.Context, t WakeTrigger) (pass, error) {
	if r.group != nil {
		return r.group.pass(ctx, r, t)
	}
	q := r.newPass(t)
	relaypass.Run(ctx, &q.Pass)
	return q.p, q.err
}

// passReq is one pass of r started by t, alone or in a group's shared
// pass, and its outcome; its methods are the pass's relaypass.Hooks.
type passReq struct {
	relaypass.Pass[Message]
	r   *Relay
	t   WakeTrigger
	p   pass
	err error
}

func (r *Relay) newPass(t WakeTrigger) *passReq {
	q := &passReq{r: r, t: t}
	q.Table, q.Hooks = &r.tbl, q
	return q
}

// Claimed reports EventClaimed.
func (q *passReq) Claimed(n int) { q.r.event(RelayEvent{Kind: EventClaimed, N: n, Trigger: q.t}) }

// Publish hands msgs to the relay's Publisher.
func (q *passReq) Publish(ctx context.Context, msgs []Message) relaypass.Published {
	return q.r.publish(ctx, msgs)
}

// Failed reports EventPassFailed.
func (q *passReq) Failed(stage string, err error) { q.p, q.err = pass{}, q.r.fail(stage, err) }

// Done reports the committed pass's events.
func (q *passReq) Done(res relaypass.Result[Message]) { q.p = q.r.report(q.t, res) }

// scanMessage reads a claimed row (outboxsql.Relay.Claim) into m.
func scanMessage(rows pgx.Rows, m *Message, wait *float64) error {
	return rows.Scan(&m.RowID, &m.ID, &m.Event, &m.Payload, &m.CreatedAt, &m.Headers, wait)
}

// publish hands msgs to the Publisher under PublishTimeout and finds the
// row a MessageError blames.
func (r *Relay) publish(ctx context.Context, msgs []Message) relaypass.Published {
	pctx, cancel := context.WithTimeout(ctx, r.pubTO)
	err := r.pub.Publish(pctx, msgs)
	cancel()
	p := relaypass.Published{K: -1}
	var poison *MessageError
	if err != nil && errors.As(err, &poison) {
		p.K = slices.IndexFunc(msgs, func(m Message) bool { return m.RowID == poison.RowID })
		p.PoisonID, p.PoisonErr = poison.RowID, poison.Err
	}
	if err != nil && p.K < 0 {
		p.Err = fmt.Errorf("outbox: relay: publish %d rows: %w", len(msgs), err)
	}
	return p
}

// report turns a committed pass into what the loop needs of it, and
// reports its events and log lines.
func (r *Relay) report(t WakeTrigger, res relaypass.Result[Message]) (p pass) {
	p.n, p.wait = res.N, res.Wait
	if bad := res.Blamed; bad != nil {
		e := RelayEvent{Kind: EventMessageFailed, RowID: bad.RowID, MessageID: bad.ID, Attempts: res.Failures, Err: res.BlameErr}
		if res.Parked {
			// The rows behind it can go at once.
			e.Kind, p.more, p.wait = EventParked, true, 0
			r.log.Error("parked an outbox row: its publish failed too often; the rows behind it go on, it waits for a retry",
				slog.Int64("row_id", bad.RowID), slog.String("message_id", bad.ID), slog.Int("attempts", res.Failures),
				slog.Any("err", res.BlameErr))
		} else {
			p.wait = backoff.Delay(r.tbl.BackoffMin, r.tbl.BackoffMax, res.Failures-1)
			e.Duration = p.wait
			r.log.Warn("publishing an outbox row failed; it holds back the rows behind it until it is published or parked",
				slog.Int64("row_id", bad.RowID), slog.String("message_id", bad.ID), slog.Int("attempts", res.Failures),
				slog.Int("max_attempts", r.tbl.MaxAttempts), slog.Duration("retry_in", p.wait), slog.Any("err", res.BlameErr))
		}
		r.event(e)
	}
	if p.n > 0 {
		r.event(RelayEvent{Kind: EventPublished, N: p.n, Duration: res.Took, Trigger: t})
	}
	return p
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
// ctx is cancelled. The passes of a drain carry the trigger of its start.
func (r *Relay) loop(ctx context.Context, stopping <-chan struct{}) {
	var trigger WakeTrigger
	cfg := passloop.Config{Poll: r.poll, ErrMin: errBackoffMin, ErrMax: errBackoffMax, Log: r.log, Linger: r.linger}
	passloop.Run(ctx, stopping, r.wake.C(), cfg, func(c passloop.Cause) {
		switch c {
		case passloop.Woken:
			trigger = triggerOf(r.wake.Take(), trigger)
		case passloop.Polled:
			trigger = TriggerPoll
		case passloop.Retried:
			trigger = TriggerRetry
		}
	}, func(ctx context.Context) (passloop.Outcome, error) {
		p, err := r.runOnce(ctx, trigger)
		return passloop.Outcome{More: p.n >= r.tbl.BatchSize || p.more, Wait: p.wait, Rows: p.n}, err
	})
}

// onNotify turns a notification into a Wake unless IgnoreNotification
// drops it. Called from the notifier's goroutine.
func (r *Relay) onNotify(_ string, pid uint32) {
	if !r.subscribed.Load() || (r.ignore != nil && r.ignore(pid)) {
		return
	}
	r.wake.Wake(wakeByNotify)
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
	r.wake.Wake(wakeByCatchUp)
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
