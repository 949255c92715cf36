// Package limit holds the per-client limits of the HTTP guard: token
// buckets by key (Rate) and a cap on what a key holds at once (Cap).
package limit

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Rate is one token bucket per key (golang.org/x/time/rate). Buckets that
// are full again are dropped when the map grows past sweepAt, so memory
// stays bounded by the keys active within about burst/rate seconds. Safe
// for concurrent use.
type Rate struct {
	rate  rate.Limit
	burst int
	mu    sync.Mutex
	m     map[string]*rate.Limiter
}

// sweepAt is the map size that triggers a sweep of full buckets.
const sweepAt = 4096

// NewRate returns buckets of burst tokens (> 0) that refill at perSecond
// tokens per second (> 0), one per key.
func NewRate(perSecond float64, burst int) *Rate {
	return &Rate{rate: rate.Limit(perSecond), burst: burst, m: map[string]*rate.Limiter{}}
}

// Reserve takes a token of key's bucket: 0 when there was one, else the
// wait until there is (nothing is taken then).
func (k *Rate) Reserve(key string) time.Duration {
	now := time.Now()
	k.mu.Lock()
	l := k.m[key]
	if l == nil {
		if len(k.m) >= sweepAt {
			for key, l := range k.m {
				if l.TokensAt(now) >= float64(k.burst) {
					delete(k.m, key)
				}
			}
		}
		l = rate.NewLimiter(k.rate, k.burst)
		k.m[key] = l
	}
	k.mu.Unlock()
	r := l.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return d
	}
	return 0
}

// Cap counts what each key holds at once (a user's open WebSockets) and
// refuses one more at its maximum. Safe for concurrent use.
type Cap struct {
	max int
	mu  sync.Mutex
	n   map[string]int // key → held now; a key holding none is absent
}

// NewCap returns a cap of max per key; a negative max is no cap.
func NewCap(max int) *Cap { return &Cap{max: max, n: map[string]int{}} }

// Max is the cap per key (negative: none).
func (c *Cap) Max() int { return c.max }

// Take counts one more for key unless key is at the cap (then ok is
// false). release gives it back; it is idempotent.
func (c *Cap) Take(key string) (release func(), ok bool) {
	if c.max < 0 {
		return func() {}, true
	}
	c.mu.Lock()
	if c.n[key] >= c.max {
		c.mu.Unlock()
		return nil, false
	}
	c.n[key]++
	c.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			if c.n[key]--; c.n[key] <= 0 {
				delete(c.n, key)
			}
			c.mu.Unlock()
		})
	}, true
}
