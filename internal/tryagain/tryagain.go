// Package tryagain retries a Redis call that a Redis Cluster slot
// migration refused: TRYAGAIN (a multi-key script or MULTI whose keys are
// split between the two nodes), or an ASK or MOVED left over when
// go-redis's own redirections ran out.
package tryagain

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// Waits between two tries of Retry: the first, and the most it doubles up
// to.
const (
	FirstWait = 5 * time.Millisecond
	MaxWait   = 100 * time.Millisecond
)

// Is reports whether err is a reply of a slot in migration that go-redis
// gave up on: TRYAGAIN (the keys are split between the two nodes), or an
// ASK or MOVED left over when its redirections ran out (ASK and TRYAGAIN
// alternate while the keys are split).
func Is(err error) bool {
	if err == nil {
		return false
	}
	for _, p := range []string{"TRYAGAIN", "ASK ", "MOVED "} {
		if redis.HasErrorPrefix(err, p) {
			return true
		}
	}
	return false
}

// Retry calls op, and again after a wait growing from FirstWait to MaxWait
// while it fails as Is tells, for at most budget in all and never past
// ctx's deadline or end: then it returns op's last error. Any other result
// is returned at once. Safe for concurrent use (op's safety is the
// caller's).
func Retry(ctx context.Context, budget time.Duration, op func() error) error {
	until := time.Now().Add(budget)
	wait := FirstWait
	for {
		err := op()
		if !Is(err) || !sleep(ctx, until, &wait) {
			return err
		}
	}
}

// sleep sleeps *wait (then doubles it, up to MaxWait) and reports true, or
// reports false at once when the sleep would end past until or ctx's
// deadline, or when ctx ends during it.
func sleep(ctx context.Context, until time.Time, wait *time.Duration) bool {
	end := time.Now().Add(*wait)
	if d, ok := ctx.Deadline(); end.After(until) || (ok && end.After(d)) {
		return false
	}
	t := time.NewTimer(*wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	}
	*wait = min(2**wait, MaxWait)
	return true
}
