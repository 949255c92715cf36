package outbox

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/internal/service"
	"github.com/outboxchat/outboxchat/outbox/internal/outboxsql"
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
	pool     *pgxpool.Pool
	timeout  time.Duration
	interval time.Duration
	log      *slog.Logger

	mu      sync.Mutex
	pending []string // distinct channels recorded since the last take

	wake chan struct{} // 1-buffered: something is pending
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
		pool: pool, timeout: timeout, interval: interval,
		log:  log.With(slog.String("component", "outbox.writer")),
		wake: make(chan struct{}, 1),
		life: service.Lifecycle{Name: "outbox: notifier"},
	}
}

// Notify records a wake-up on channel, to be sent with the next notify
// statement. It never blocks.
func (n *Notifier) Notify(channel string) {
	n.mu.Lock()
	if !slices.Contains(n.pending, channel) {
		n.pending = append(n.pending, channel)
	}
	n.mu.Unlock()
	wakeUp(n.wake)
}

// take empties the recorded channels and returns them.
func (n *Notifier) take() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	chs := n.pending
	n.pending = nil
	return chs
}

// Start starts the Notifier's goroutine. It does not block and follows the
// contract of internal/service: the goroutine runs until Stop, or until ctx
// is cancelled (a hard stop). Errors: ErrAlreadyStarted while a run is in
// progress, or ctx.Err() (both wrapped).
func (n *Notifier) Start(ctx context.Context) error {
	return n.life.Start(ctx, func(run *service.Run) {
		run.Go(func() { n.loop(run.DrainContext(), run.Context()) })
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

// loop sends the coalesced notifies until stopping ends; each statement
// runs under ctx (the run's context), so a graceful stop lets it finish.
func (n *Notifier) loop(stopping, ctx context.Context) {
	var last time.Time // start of the previous statement
	for {
		select {
		case <-stopping.Done():
			return
		case <-n.wake:
		}
		if wait := time.Until(last.Add(n.interval)); n.interval > 0 && wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-stopping.Done():
				t.Stop()
				return
			case <-t.C:
			}
			select { // calls made while waiting are covered by this statement
			case <-n.wake:
			default:
			}
		}
		chs := n.take()
		if len(chs) == 0 {
			continue
		}
		last = time.Now()
		nctx, cancel := context.WithTimeout(ctx, n.timeout)
		var err error
		if len(chs) == 1 {
			_, err = n.pool.Exec(nctx, outboxsql.AfterCommitNotify, chs[0])
		} else {
			_, err = n.pool.Exec(nctx, outboxsql.NotifyMany, chs)
		}
		cancel()
		if err != nil && ctx.Err() == nil {
			n.log.Warn("notify failed; the relay's poll will pick the rows up",
				slog.Any("channels", chs), slog.Any("err", err))
		}
	}
}
