// Package passloop decides when a running outbox relay passes: on a
// wake-up, or when its poll timer fires, it starts a drain, passes until a
// pass comes back less than full, and sets the timer for the next poll, or
// sooner when a row waits after a failure of its own. A failed pass is
// tried again after a doubling pause. Under load a woken drain may linger
// (Config.Linger) so that it carries the rows committed meanwhile.
package passloop

import (
	"context"
	"log/slog"
	"time"

	"github.com/outboxchat/outboxchat/internal/backoff"
)

// Cause is what started a drain.
type Cause int

const (
	// Woken: a wake-up came on the loop's channel.
	Woken Cause = iota
	// Polled: the poll interval passed without a wake-up.
	Polled
	// Retried: the wait of a row that failed by its own fault ran out.
	Retried
)

// Outcome is what one pass did, as the loop needs it.
type Outcome struct {
	// More: pass again at once (the batch was full, or a row was parked).
	More bool
	// Wait > 0 (when not More): a row waits this long after a failure of
	// its own; the next pass is due by then.
	Wait time.Duration
	// Rows is how many rows the pass published (Config.Linger).
	Rows int
}

// Config configures Run; every field but Linger is required.
type Config struct {
	// Poll is the poll interval (> 0).
	Poll time.Duration
	// ErrMin and ErrMax bound the pause after a failed pass: ErrMin after
	// the first, doubling with each further one in a row, at most ErrMax.
	ErrMin, ErrMax time.Duration
	// Log receives a Warn line per failed pass.
	Log *slog.Logger
	// Linger (>= 0; 0: never) is how long after the previous drain began
	// a woken drain waits to start, when that drain published more than
	// one row: commits are then coming faster than passes, and a pass
	// that waits carries the rows committed meanwhile, so the pass's
	// fixed cost (a claim, an add, a commit) is paid for more rows. A
	// wake-up more than Linger after the previous drain began, or after a
	// drain of one row or none, starts at once: an idle or lightly loaded
	// relay adds no delay, a busy one at most Linger.
	Linger time.Duration
}

// Run runs drains until stopping is closed or ctx is cancelled. Each drain
// begins with a call of begin with its cause, then calls pass until it
// returns an Outcome without More; a wake-up that arrives meanwhile stays
// on wake and causes one more drain. begin and pass are called from Run's
// goroutine, one at a time.
func Run(ctx context.Context, stopping, wake <-chan struct{}, c Config, begin func(Cause), pass func(context.Context) (Outcome, error)) {
	poll := time.NewTimer(c.Poll)
	defer poll.Stop()
	failed := 0         // passes failed in a row
	timer := Polled     // what the poll timer's firing means
	var began time.Time // the previous drain's start
	rows := 0           // rows the previous drain published
	for {
		select {
		case <-stopping:
			return
		case <-ctx.Done():
			return
		case <-wake:
			if rows > 1 && !linger(ctx, stopping, time.Until(began.Add(c.Linger))) {
				return
			}
			begin(Woken)
		case <-poll.C:
			begin(timer)
		}
		began, rows = time.Now(), 0
		next := c.Poll
		for {
			select {
			case <-stopping:
				return
			default:
			}
			o, err := pass(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				pause := backoff.Delay(c.ErrMin, c.ErrMax, failed)
				failed++
				c.Log.Warn("pass failed; rows stay unsent for the next pass",
					slog.Any("err", err), slog.Duration("retry_in", pause))
				if !backoff.Sleep(ctx, stopping, pause) {
					return
				}
				continue
			}
			failed = 0
			rows += o.Rows
			if !o.More {
				if o.Wait > 0 {
					next = min(next, o.Wait)
				}
				break
			}
		}
		timer = Polled
		if next < c.Poll {
			timer = Retried
		}
		poll.Reset(next)
	}
}

// linger waits d (nothing when d <= 0) and reports whether the loop goes
// on: false when stopping closed or ctx ended meanwhile.
func linger(ctx context.Context, stopping <-chan struct{}, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-stopping:
		return false
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
