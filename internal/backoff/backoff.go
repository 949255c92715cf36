// Package backoff is the pause of the library's retry loops (the outbox
// relay's failed passes and poison rows, the inbox consumer's failed
// batches and fetches, the notifier's reconnects): a delay that doubles with
// each failure up to a cap, and a wait for it that a stop cuts short.
package backoff

import (
	"context"
	"time"
)

// Delay is base doubled n times, capped at limit: base (or limit, when
// smaller) for n ≤ 0. It does not overflow for any n.
func Delay(base, limit time.Duration, n int) time.Duration {
	d := base
	for range n {
		if d >= limit/2 {
			return limit
		}
		d *= 2
	}
	return min(d, limit)
}

// Sleep waits d. It returns false, at once, when ctx ends or stop is
// closed first (a nil stop is never closed), else true.
func Sleep(ctx context.Context, stop <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-stop:
		return false
	case <-ctx.Done():
		return false
	}
}
