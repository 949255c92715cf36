// Package passloop decides when a running outbox relay passes: on a
// wake-up, or when its poll timer fires, it starts a drain, passes until a
// pass comes back less than full, and sets the timer for the next poll, or
// sooner when a row waits after a failure of its own. A failed pass is
// tried again after a doubling pause.
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
}

// Config configures Run; every field is required.
type Config struct {
	// Poll is the poll interval (> 0).
	Poll time.Duration
	// ErrMin and ErrMax bound the pause after a failed pass: ErrMin after
	// the first, doubling with each further one in a row, at most ErrMax.
	ErrMin, ErrMax time.Duration
	// Log receives a Warn line per failed pass.
	Log *slog.Logger
}

// Run runs drains until stopping is closed or ctx is cancelled. Each drain
// begins with a call of begin with its cause, then calls pass until it
// returns an Outcome without More; a wake-up that arrives meanwhile stays
// on wake and causes one more drain. begin and pass are called from Run's
// goroutine, one at a time.
func Run(ctx context.Context, stopping, wake <-chan struct{}, c Config, begin func(Cause), pass func(context.Context) (Outcome, error)) {
	poll := time.NewTimer(c.Poll)
	defer poll.Stop()
	failed := 0     // passes failed in a row
	timer := Polled // what the poll timer's firing means
	for {
		select {
		case <-stopping:
			return
		case <-ctx.Done():
			return
		case <-wake:
			begin(Woken)
		case <-poll.C:
			begin(timer)
		}
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
