// Package notifysend sends an outbox Writer's post-commit wake-ups: it
// coalesces the channels recorded by Notify and sends them with one
// pg_notify statement at a time, a transaction of its own, so under load
// there is at most one statement in flight and whatever commits meanwhile
// rides on the next one. Package outbox's Notifier wraps it with its
// lifecycle.
package notifysend

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/outbox/internal/outboxsql"
	"github.com/outboxchat/outboxchat/outbox/internal/wakeup"
)

// Sender records channels and sends them. Make it with New. Notify is safe
// for concurrent use; Run must have one caller at a time.
type Sender struct {
	pool     *pgxpool.Pool
	timeout  time.Duration
	interval time.Duration
	log      *slog.Logger

	mu      sync.Mutex
	pending []string // distinct channels recorded since the last take

	wake *wakeup.Signal // something is pending
}

// New returns a Sender that notifies on pool, each statement bounded by
// timeout (> 0), the starts of two statements at least interval apart (0:
// no spacing), failed statements logged on log at Warn. It does not touch
// the network.
func New(pool *pgxpool.Pool, timeout, interval time.Duration, log *slog.Logger) *Sender {
	return &Sender{pool: pool, timeout: timeout, interval: interval, log: log, wake: wakeup.New()}
}

// Notify records a wake-up on channel, to be sent with the next statement.
// It never blocks; what is recorded while Run is not running is sent once
// it runs.
func (s *Sender) Notify(channel string) {
	s.mu.Lock()
	if !slices.Contains(s.pending, channel) {
		s.pending = append(s.pending, channel)
	}
	s.mu.Unlock()
	s.wake.Wake(0)
}

// take empties the recorded channels and returns them.
func (s *Sender) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	chs := s.pending
	s.pending = nil
	return chs
}

// Run sends the coalesced notifies until stopping ends; each statement
// runs under ctx (a run's context, which outlives stopping on a graceful
// stop), so a graceful stop lets the one in flight finish.
func (s *Sender) Run(stopping, ctx context.Context) {
	var last time.Time // start of the previous statement
	for {
		select {
		case <-stopping.Done():
			return
		case <-s.wake.C():
		}
		if wait := time.Until(last.Add(s.interval)); s.interval > 0 && wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-stopping.Done():
				t.Stop()
				return
			case <-t.C:
			}
			s.wake.Drain() // calls made while waiting are covered by this statement
		}
		chs := s.take()
		if len(chs) == 0 {
			continue
		}
		last = time.Now()
		nctx, cancel := context.WithTimeout(ctx, s.timeout)
		var err error
		if len(chs) == 1 {
			_, err = s.pool.Exec(nctx, outboxsql.AfterCommitNotify, chs[0])
		} else {
			_, err = s.pool.Exec(nctx, outboxsql.NotifyMany, chs)
		}
		cancel()
		if err != nil && ctx.Err() == nil {
			s.log.Warn("notify failed; the relay's poll will pick the rows up",
				slog.Any("channels", chs), slog.Any("err", err))
		}
	}
}
