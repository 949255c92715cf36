// Package notifier keeps one Postgres LISTEN connection per process and
// hands its notifications to subscribers by channel: the outbox relay, the
// chat gateway, and any later part that wakes on a NOTIFY. Modelled on
// River's internal/notifier (riverqueue/river).
//
// It does, once for all of them: connect on a dedicated connection (not
// from a pool, so it never takes a pooled connection away), LISTEN on every
// subscribed channel, reconnect with a doubling back-off after a failure,
// ping an idle connection so that a silently dead one is noticed, tell every
// subscriber after each (re)connect so that it catches up on what was
// committed while nobody listened (notifications sent meanwhile are lost),
// and drop, for subscribers that ask, the notifications this process's own
// connections sent.
//
// The connection's settings come from Config.ConnConfig: a separate LISTEN
// database URL (e.g. direct to Postgres when the pool goes through a
// transaction-mode PgBouncer, which cannot LISTEN) is a different ConnConfig.
//
// Self-check: after each (re)connect the notifier LISTENs on
// SelfCheckChannel and sends that channel a NOTIFY with a random payload
// from a second, short-lived connection of the same ConnConfig, then waits
// Config.SelfCheckTimeout (2 s) for it. Through a pooler in transaction mode
// the LISTEN lands on some server connection that is handed back to the pool
// right after, so the notification never reaches this client: the check
// fails, a loud warning names the cause and Config.SelfCheckFix, and
// SelfCheckOK reports false (subscribers keep their poll). The NOTIFY is
// sent from another connection, not this one, and the LISTEN connection
// runs no statement while it waits (subscription changes wait up to the 2 s):
// through a pooler, a statement of its own could reach the server
// connection that ran the LISTEN and collect the notification there,
// passing a check that other processes' notifications fail.
package notifier

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/internal/backoff"
	"github.com/outboxchat/outboxchat/internal/service"
)

// Defaults of Config's zero fields.
const (
	// DefaultApplicationName is the LISTEN connection's application_name
	// when ConnConfig sets none.
	DefaultApplicationName = "outboxchat_listen"
	// DefaultReconnectMin is the first pause before a reconnect; it doubles
	// after each further failure up to DefaultReconnectMax. A lost
	// connection is reconnected at once; the pause is for failed connects.
	DefaultReconnectMin = 50 * time.Millisecond
	// DefaultReconnectMax caps the doubling reconnect pause. It is the
	// subscribers' default poll interval (1 s, outbox.DefaultPollInterval):
	// while Postgres is back but the notifier still waits, every wake-up
	// falls back to the poll, so waiting longer than one poll between tries
	// would only stretch the time spent on the poll after an outage.
	DefaultReconnectMax = time.Second
	// DefaultConnectTimeout bounds one connect + LISTEN.
	DefaultConnectTimeout = 5 * time.Second
	// DefaultPingEvery is how long the connection may stay idle before it is
	// pinged.
	DefaultPingEvery = 30 * time.Second
	// DefaultPingTimeout bounds that ping.
	DefaultPingTimeout = 5 * time.Second
	// DefaultSelfCheckTimeout is how long the self-check waits for its own
	// NOTIFY after each connect (a notification on a working connection
	// arrives in milliseconds; 2 s leaves room for a loaded machine).
	DefaultSelfCheckTimeout = 2 * time.Second
	// DefaultSelfCheckFix is the remedy the self-check's warning names when
	// Config.SelfCheckFix is empty.
	DefaultSelfCheckFix = "give the LISTEN connection a direct (or session-mode pooler) database URL"
)

// SelfCheckChannel is the channel of the self-check's NOTIFY. Every
// notifier LISTENs on it; a payload that is not its own is ignored.
const SelfCheckChannel = "outboxchat_notifier_selfcheck"

// ErrInvalidConfig is wrapped by New for an unusable Config.
var ErrInvalidConfig = errors.New("notifier: invalid config")

// Config configures New. A zero field means its default.
type Config struct {
	// ConnConfig is the LISTEN connection's configuration (copied; not
	// modified). Required.
	ConnConfig *pgx.ConnConfig
	// ApplicationName is set as application_name when ConnConfig sets none.
	// Default DefaultApplicationName.
	ApplicationName string
	// Own reports whether a backend PID belongs to one of this process's
	// own connections (e.g. collected with pgxpool.Config.AfterConnect);
	// subscriptions with SkipOwn drop the notifications those sent. Called
	// from the notifier's goroutine; must not block. Default nil: none is.
	Own func(pid uint32) bool
	// ReconnectMin and ReconnectMax bound the doubling pause between
	// reconnect attempts. Defaults DefaultReconnectMin (50 ms) and
	// DefaultReconnectMax (1 s).
	ReconnectMin, ReconnectMax time.Duration
	// ConnectTimeout bounds one connect + LISTEN. Default
	// DefaultConnectTimeout (5 s).
	ConnectTimeout time.Duration
	// PingEvery is the idle time after which the connection is pinged, and
	// PingTimeout bounds the ping. Defaults DefaultPingEvery (30 s) and
	// DefaultPingTimeout (5 s).
	PingEvery, PingTimeout time.Duration
	// SelfCheckTimeout is how long the self-check (package doc) waits for its
	// NOTIFY after each connect. Default DefaultSelfCheckTimeout (2 s);
	// negative turns the self-check off (SelfCheckOK then stays false).
	SelfCheckTimeout time.Duration
	// SelfCheckFix is the remedy named by the failed self-check's warning,
	// e.g. the flag that sets a direct LISTEN URL. Default
	// DefaultSelfCheckFix.
	SelfCheckFix string
	// OnSelfCheck, when set, is called with each self-check's outcome (true:
	// the NOTIFY arrived) from one of the notifier's goroutines; it must
	// not block. Default nil.
	OnSelfCheck func(ok bool)
	// Logger receives connection failures (Warn) with component=notifier.
	// Default slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns a copy of c in which every zero field holds its
// default. A nil c gives defaults without ConnConfig.
func (c *Config) WithDefaults() *Config {
	d := *cmp.Or(c, &Config{})
	d.ApplicationName = cmp.Or(d.ApplicationName, DefaultApplicationName)
	for _, f := range []struct {
		v   *time.Duration
		def time.Duration
	}{
		{&d.ReconnectMin, DefaultReconnectMin},
		{&d.ReconnectMax, DefaultReconnectMax},
		{&d.ConnectTimeout, DefaultConnectTimeout},
		{&d.PingEvery, DefaultPingEvery},
		{&d.PingTimeout, DefaultPingTimeout},
		{&d.SelfCheckTimeout, DefaultSelfCheckTimeout},
	} {
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	d.SelfCheckFix = cmp.Or(d.SelfCheckFix, DefaultSelfCheckFix)
	d.Logger = cmp.Or(d.Logger, slog.Default())
	return &d
}

func (c *Config) validate() error {
	if c.ConnConfig == nil {
		return fmt.Errorf("ConnConfig is required: %w", ErrInvalidConfig)
	}
	if c.ReconnectMin < 0 || c.ReconnectMax < c.ReconnectMin || c.ConnectTimeout < 0 || c.PingEvery < 0 || c.PingTimeout < 0 {
		return fmt.Errorf("negative duration or ReconnectMax < ReconnectMin: %w", ErrInvalidConfig)
	}
	return nil
}

// Subscription is one subscriber's interest in a channel. Its callbacks run
// on the notifier's goroutine, one at a time, and must not block (a
// coalescing wake-up is the usual body); each may be nil.
type Subscription struct {
	// Channel is the channel to LISTEN on (1 to 63 bytes). Required.
	Channel string
	// SkipOwn drops the notifications sent by this process's own
	// connections (Config.Own).
	SkipOwn bool
	// Notify is called for every notification on Channel (not dropped by
	// SkipOwn) with its payload and the sender's backend PID.
	Notify func(payload string, senderPID uint32)
	// Up is called once LISTEN covers Channel: after every (re)connect, and
	// at once when subscribing to a connected notifier. Notifications sent
	// while nobody listened are lost: catch up here.
	Up func()
	// Down is called with the error when the connection failed (each failed
	// attempt) or was lost, and with nil when the notifier stops;
	// notifications are missed until the next Up.
	Down func(err error)
}

// sub is a subscription's state, owned by the notifier goroutine except
// the Subscription itself.
type sub struct {
	Subscription
	live bool // Up was called on the current connection
}

// Notifier is a process's one LISTEN connection; see the package doc.
// Create it with New, add subscriptions with Subscribe (before or after
// Start), and Start and Stop it per internal/service's contract. All methods
// are safe for concurrent use.
type Notifier struct {
	cfg  Config
	life service.Lifecycle

	mu         sync.Mutex
	subs       []*sub
	dirty      bool               // subscriptions changed since the loop last looked
	interrupt  context.CancelFunc // ends the loop's current wait, nil when not waiting
	listening  atomic.Bool
	reconnects atomic.Int64
	downSince  time.Time // when the latest lost connection went; loop goroutine only
	everUp     bool      // a connection has LISTENed before; loop goroutine only

	checkOK atomic.Bool
}

// New validates cfg (after WithDefaults) and returns a stopped Notifier.
// Errors wrap ErrInvalidConfig.
func New(cfg *Config) (*Notifier, error) {
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("notifier: new: %w", err)
	}
	c.Logger = c.Logger.With(slog.String("component", "notifier"))
	return &Notifier{cfg: *c, life: service.Lifecycle{Name: "notifier"}}, nil
}

// Own reports whether pid is one of this process's own backends
// (Config.Own; false without one). Safe for concurrent use.
func (n *Notifier) Own(pid uint32) bool { return n.cfg.Own != nil && n.cfg.Own(pid) }

// Listening reports whether the LISTEN connection is up.
func (n *Notifier) Listening() bool { return n.listening.Load() }

// Reconnects returns how many times the LISTEN connection came back after
// it was lost or failed (its first connect does not count): each one
// LISTENed on every channel again and told every subscriber to catch up.
// Safe for concurrent use.
func (n *Notifier) Reconnects() int64 { return n.reconnects.Load() }

// SelfCheckOK reports whether the latest self-check's NOTIFY arrived:
// false before the first check has passed, after a failed one, and while
// the self-check is off. Safe for concurrent use.
func (n *Notifier) SelfCheckOK() bool { return n.checkOK.Load() }

// Subscribe adds s and returns the function that removes it (idempotent;
// after it returns no callback of s runs... except one already running).
// It never blocks on the network: a running notifier LISTENs on a new
// channel from its own goroutine and then calls s.Up.
func (n *Notifier) Subscribe(s Subscription) (unsubscribe func()) {
	sb := &sub{Subscription: s}
	n.mu.Lock()
	n.subs = append(n.subs, sb)
	n.changedLocked()
	n.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			n.mu.Lock()
			for i, x := range n.subs {
				if x == sb {
					n.subs = append(n.subs[:i:i], n.subs[i+1:]...)
					break
				}
			}
			n.changedLocked()
			n.mu.Unlock()
		})
	}
}

func (n *Notifier) changedLocked() {
	n.dirty = true
	if n.interrupt != nil {
		n.interrupt()
	}
}

// Start opens the LISTEN connection from a goroutine of its own and returns
// at once (internal/service contract: cancelling ctx is a hard stop).
// Errors: service.ErrAlreadyStarted or ctx.Err(), wrapped.
func (n *Notifier) Start(ctx context.Context) error {
	return n.life.Start(ctx, func(r *service.Run) { r.Go(func() { n.run(r.DrainContext()) }) })
}

// Stop closes the connection and waits for the goroutine; ctx bounds the
// wait. Idempotent; nil if not running.
func (n *Notifier) Stop(ctx context.Context) error {
	return n.life.Stop(ctx)
}

// Started returns a channel closed once the latest Start succeeded.
func (n *Notifier) Started() <-chan struct{} { return n.life.Started() }

// Stopped returns a channel closed once the latest run has stopped.
func (n *Notifier) Stopped() <-chan struct{} { return n.life.Stopped() }

// run keeps a connection open until ctx ends.
func (n *Notifier) run(ctx context.Context) {
	failed := 0 // connects failed in a row
	for ctx.Err() == nil {
		conn, err := n.connect(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			pause := backoff.Delay(n.cfg.ReconnectMin, n.cfg.ReconnectMax, failed)
			failed++
			n.down(err)
			n.cfg.Logger.Warn("listen connection failed; subscribers poll meanwhile",
				slog.Any("err", err), slog.Duration("retry_in", pause))
			if !backoff.Sleep(ctx, nil, pause) {
				return
			}
			continue
		}
		n.listening.Store(true)
		listened, err := n.serve(ctx, conn)
		n.listening.Store(false)
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), n.cfg.PingTimeout)
		_ = conn.Close(cctx)
		cancel()
		if ctx.Err() != nil {
			n.down(nil)
			return
		}
		n.down(err)
		if n.everUp && n.downSince.IsZero() {
			n.downSince = time.Now()
		}
		if listened {
			// A connection that was serving is reconnected at once: a
			// backend terminated or a pooler restarted is back in one
			// round trip, and the poll covers the moment between.
			failed = 0
			n.cfg.Logger.Warn("listen connection lost; reconnecting, subscribers poll meanwhile", slog.Any("err", err))
			continue
		}
		// It failed before it LISTENed: back off as after a failed connect,
		// so that a server that accepts connections and then fails them is
		// not retried in a tight loop.
		pause := backoff.Delay(n.cfg.ReconnectMin, n.cfg.ReconnectMax, failed)
		failed++
		n.cfg.Logger.Warn("listen connection failed before it listened; subscribers poll meanwhile",
			slog.Any("err", err), slog.Duration("retry_in", pause))
		if !backoff.Sleep(ctx, nil, pause) {
			return
		}
	}
}

// connect opens the dedicated connection (LISTEN happens in serve).
func (n *Notifier) connect(ctx context.Context) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.ConnectTimeout)
	defer cancel()
	cc := n.cfg.ConnConfig.Copy()
	if cc.RuntimeParams == nil {
		cc.RuntimeParams = map[string]string{}
	}
	if cc.RuntimeParams["application_name"] == "" {
		cc.RuntimeParams["application_name"] = n.cfg.ApplicationName
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, fmt.Errorf("notifier: connect: %w", err)
	}
	return conn, nil
}

// down tells every subscriber the connection is not (or no longer) up.
func (n *Notifier) down(err error) {
	n.mu.Lock()
	subs := make([]*sub, len(n.subs))
	copy(subs, n.subs)
	n.mu.Unlock()
	for _, s := range subs {
		s.live = false
		if s.Down != nil {
			s.Down(err)
		}
	}
}

// serve LISTENs for the subscriptions and dispatches notifications until
// the connection fails (returned) or ctx ends (nil); up reports whether it
// got as far as LISTENing on every channel.
func (n *Notifier) serve(ctx context.Context, conn *pgx.Conn) (up bool, err error) {
	listened := map[string]bool{}
	if err := n.sync(ctx, conn, listened); err != nil {
		return false, err
	}
	if n.everUp {
		n.reconnects.Add(1)
		args := []any{slog.Int("channels", len(listened))}
		if !n.downSince.IsZero() {
			args = append(args, slog.Duration("down_for", time.Since(n.downSince).Round(time.Millisecond)))
		}
		n.cfg.Logger.Info("listen connection back; wake-ups by NOTIFY again", args...)
	}
	n.everUp, n.downSince = true, time.Time{}
	if n.cfg.SelfCheckTimeout > 0 {
		if err := n.selfCheck(ctx, conn, listened); err != nil || ctx.Err() != nil {
			return true, err
		}
	}
	for {
		if err := n.sync(ctx, conn, listened); err != nil {
			return true, err
		}
		wctx, cancel := context.WithTimeout(ctx, n.cfg.PingEvery)
		n.mu.Lock()
		n.interrupt = cancel
		if n.dirty {
			cancel()
		}
		n.mu.Unlock()
		note, err := conn.WaitForNotification(wctx)
		interrupted := errors.Is(wctx.Err(), context.Canceled)
		n.mu.Lock()
		n.interrupt = nil
		n.mu.Unlock()
		cancel()
		if ctx.Err() != nil {
			return true, nil
		}
		if err == nil {
			n.dispatch(note.Channel, note.Payload, note.PID)
			continue
		}
		if conn.IsClosed() || !(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
			return true, fmt.Errorf("notifier: wait: %w", err)
		}
		if interrupted {
			continue // subscriptions changed
		}
		pctx, cancel := context.WithTimeout(ctx, n.cfg.PingTimeout)
		err = conn.Ping(pctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return true, nil
			}
			return true, fmt.Errorf("notifier: ping: %w", err)
		}
	}
}

// sync brings the connection's LISTENs in line with the subscriptions and
// calls Up for every subscription not yet live on this connection.
func (n *Notifier) sync(ctx context.Context, conn *pgx.Conn, listened map[string]bool) error {
	n.mu.Lock()
	n.dirty = false
	subs := make([]*sub, len(n.subs))
	copy(subs, n.subs)
	n.mu.Unlock()
	want := map[string]bool{}
	for _, s := range subs {
		want[s.Channel] = true
	}
	for ch := range want {
		if !listened[ch] {
			if err := n.exec(ctx, conn, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
				return fmt.Errorf("notifier: listen %q: %w", ch, err)
			}
			listened[ch] = true
		}
	}
	for ch := range listened {
		if !want[ch] && ch != SelfCheckChannel {
			if err := n.exec(ctx, conn, "UNLISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
				return fmt.Errorf("notifier: unlisten %q: %w", ch, err)
			}
			delete(listened, ch)
		}
	}
	for _, s := range subs {
		if !s.live {
			s.live = true
			if s.Up != nil {
				s.Up()
			}
		}
	}
	return nil
}

func (n *Notifier) exec(ctx context.Context, conn *pgx.Conn, sql string) error {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.ConnectTimeout)
	defer cancel()
	_, err := conn.Exec(ctx, sql)
	return err
}

// selfCheck LISTENs on SelfCheckChannel, sends it a NOTIFY with a random
// payload from a connection of its own and waits SelfCheckTimeout for it
// on conn, dispatching other notifications meanwhile. conn runs no other
// statement during the wait (subscription changes wait for the next sync):
// through a transaction pooler any statement may reach the server
// connection that ran the LISTEN and pick up the notification there, which
// would pass a check that other processes' notifications fail. It records
// and reports the outcome; it returns an error only when conn failed, and
// nil, recording nothing, when ctx ended.
func (n *Notifier) selfCheck(ctx context.Context, conn *pgx.Conn, listened map[string]bool) error {
	if err := n.exec(ctx, conn, "LISTEN "+pgx.Identifier{SelfCheckChannel}.Sanitize()); err != nil {
		return fmt.Errorf("notifier: listen %q: %w", SelfCheckChannel, err)
	}
	listened[SelfCheckChannel] = true
	deadline := time.Now().Add(n.cfg.SelfCheckTimeout)
	var b [12]byte
	_, _ = rand.Read(b[:])
	payload := hex.EncodeToString(b[:])
	sendErr := n.sendSelfCheck(ctx, payload)
	ok := false
	for sendErr == nil && !ok {
		wctx, cancel := context.WithDeadline(ctx, deadline)
		note, err := conn.WaitForNotification(wctx)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			if conn.IsClosed() || !errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("notifier: wait: %w", err)
			}
			break // timed out
		}
		if note.Channel == SelfCheckChannel {
			ok = note.Payload == payload
			continue
		}
		n.dispatch(note.Channel, note.Payload, note.PID)
	}
	n.checkOK.Store(ok)
	switch {
	case ok:
		n.cfg.Logger.Info("listen self-check passed: notifications reach this process")
	case sendErr != nil:
		n.cfg.Logger.Warn("listen self-check could not send its NOTIFY; notifications are unverified, subscribers keep polling",
			slog.Any("err", sendErr))
	default:
		n.cfg.Logger.Warn("LISTEN SELF-CHECK FAILED: a NOTIFY sent to this process's LISTEN connection did not arrive within "+
			n.cfg.SelfCheckTimeout.String()+". The usual cause is a connection pooler in transaction mode "+
			"(PgBouncer pool_mode = transaction) between this process and Postgres: it hands the LISTEN to a "+
			"server connection it then gives to other clients, so notifications never come back. "+
			"Subscribers fall back to their poll (other processes' messages and receipts arrive up to a poll interval late)",
			slog.String("fix", n.cfg.SelfCheckFix))
	}
	if n.cfg.OnSelfCheck != nil {
		n.cfg.OnSelfCheck(ok)
	}
	return nil
}

// sendSelfCheck NOTIFYs SelfCheckChannel with payload from a new
// connection of ConnConfig, closed before it returns. The statement has no
// arguments, so pgx sends it with the simple protocol: no prepared
// statement for a pooler to lose.
func (n *Notifier) sendSelfCheck(ctx context.Context, payload string) error {
	conn, err := n.connect(ctx)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), n.cfg.PingTimeout)
		_ = conn.Close(cctx)
		cancel()
	}()
	// payload is hex: safe to quote.
	return n.exec(ctx, conn, "NOTIFY "+pgx.Identifier{SelfCheckChannel}.Sanitize()+", '"+payload+"'")
}

// dispatch hands one notification to the channel's subscribers.
func (n *Notifier) dispatch(channel, payload string, pid uint32) {
	if channel == SelfCheckChannel {
		return // a late or another process's self-check
	}
	n.mu.Lock()
	var subs []*sub
	for _, s := range n.subs {
		if s.Channel == channel {
			subs = append(subs, s)
		}
	}
	n.mu.Unlock()
	own := n.cfg.Own != nil && n.cfg.Own(pid)
	for _, s := range subs {
		if (s.SkipOwn && own) || s.Notify == nil {
			continue
		}
		s.Notify(payload, pid)
	}
}
