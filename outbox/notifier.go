package outbox

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/internal/service"
	"github.com/outboxchat/outboxchat/outbox/internal/notifysend"
)

// NotifierConfig configures NewNotifier. A nil *NotifierConfig means all
// defaults; a zero field means its default.
type NotifierConfig struct {
	// Timeout bounds each notify statement. Default DefaultNotifyTimeout
	// (2 s). Must not be negative.
	Timeout time.Duration
	// Interval is the least time between the starts of two notify
	// statements (WriterConfig.NotifyInterval says when to set it).
	// Default 0: no spacing. Must not be negative.
	Interval time.Duration
	// Logger receives failed notifies (Warn) with component=outbox.writer.
	// Default slog.Default().
	Logger *slog.Logger
}

// Notifier sends the post-commit wake-ups of one or more Writers
// (WakeAfterCommit) on their NOTIFY channels. Notify records a channel and
// never blocks; one goroutine sends the channels recorded since its last
// statement in one statement, a transaction of its own, as soon as that
// statement has finished (and Interval has passed since it started), so
// under load there is at most one notify statement in flight and whatever
// commits meanwhile rides on the next one, whatever the number of
// channels.
//
// Writers of several outbox tables (one per partition, say) that share a
// Notifier (WriterConfig.Notifier) send one statement where each would send
// its own. A Writer without one makes its own. The statement does not wait
// for its commit's WAL flush (synchronous_commit=off for it alone): a
// wake-up lost to a crash only delays a relay until its poll, and the
// cluster-wide notify lock is then not held through an fsync.
//
// Create it with NewNotifier; Start it before the Writers' first commit
// (wake-ups recorded before Start are kept and sent on Start). Notify, Start,
// Stop, Started and Stopped are safe for concurrent use.
type Notifier struct {
	s    *notifysend.Sender
	life service.Lifecycle
}

// NewNotifier returns a stopped Notifier that notifies on pool. It does not
// touch the network. Errors wrap ErrInvalidConfig: a nil pool, a negative
// duration.
func NewNotifier(pool *pgxpool.Pool, cfg *NotifierConfig) (*Notifier, error) {
	if pool == nil {
		return nil, fmt.Errorf("outbox: new notifier: nil pool: %w", ErrInvalidConfig)
	}
	c := *cmp.Or(cfg, &NotifierConfig{})
	if err := checkNotNegative("Timeout Interval", c.Timeout, c.Interval); err != nil {
		return nil, fmt.Errorf("outbox: new notifier: %w", err)
	}
	return newNotifier(pool, cmp.Or(c.Timeout, DefaultNotifyTimeout), c.Interval, cmp.Or(c.Logger, slog.Default())), nil
}

func newNotifier(pool *pgxpool.Pool, timeout, interval time.Duration, log *slog.Logger) *Notifier {
	return &Notifier{
		s:    notifysend.New(pool, timeout, interval, log.With(slog.String("component", "outbox.writer"))),
		life: service.Lifecycle{Name: "outbox: notifier"},
	}
}

// Notify records a wake-up on channel, to be sent with the next notify
// statement. It never blocks.
func (n *Notifier) Notify(channel string) { n.s.Notify(channel) }

// Start starts the Notifier's goroutine. It does not block and follows the
// contract of internal/service: the goroutine runs until Stop, or until ctx
// is cancelled (a hard stop). Errors: ErrAlreadyStarted while a run is in
// progress, or ctx.Err() (both wrapped).
func (n *Notifier) Start(ctx context.Context) error {
	return n.life.Start(ctx, func(run *service.Run) {
		run.Go(func() { n.s.Run(run.DrainContext(), run.Context()) })
	})
}

// Stop stops the Notifier: it sends no new statement, lets an in-flight one
// finish (bounded by Timeout) and waits for the goroutine. If ctx ends first
// the in-flight statement is cancelled (it is only a wake-up), Stop waits
// for the goroutine and returns ctx's error (wrapped). Idempotent; nil if
// not running. Start may be called again afterwards.
func (n *Notifier) Stop(ctx context.Context) error {
	return n.life.Stop(ctx)
}

// Started returns a channel closed once the latest Start succeeded.
func (n *Notifier) Started() <-chan struct{} { return n.life.Started() }

// Stopped returns a channel closed once the goroutine of the latest run has
// returned (closed before the first Start).
func (n *Notifier) Stopped() <-chan struct{} { return n.life.Stopped() }
