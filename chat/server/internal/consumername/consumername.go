// Package consumername settles the worker role's consumer name and keeps
// it live: Claim picks a name no live process of the group holds, and a
// Keeper refreshes the process's entry in the presence set of the stream
// it reads (package chat/presence), warns while another live process
// shares the name, and deletes the group's consumers that are gone.
package consumername

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/outboxchat/outboxchat/chat/presence"
	"github.com/outboxchat/outboxchat/internal/service"
)

// pruneEvery is how often the worker role deletes the consumers of its
// group that are gone (presence.Process.PruneGone); pruneIdleMin the least
// idle time of a consumer it deletes (at least 10 × the lock duration).
const (
	pruneEvery   = time.Minute
	pruneIdleMin = 10 * time.Minute
)

// Keeper keeps this process's consumer name live in the presence set of
// the stream it reads (package presence): refreshed every ttl/3, left on a
// graceful stop (so the next process may claim the name at once). Each
// refresh learns which other live processes use the same name: a change is
// logged (a warning while any does) and Shared counts them
// (outboxchat_consumer_name_shared). It also deletes, every minute, the
// group's consumers that are gone with nothing pending. A service
// (Start/Stop, internal/service); it starts before the worker and stops
// after it.
type Keeper struct {
	p         *presence.Process
	name      string
	pruneIdle time.Duration // least idle time of a pruned consumer
	log       *slog.Logger
	life      service.Lifecycle

	shared atomic.Int64 // other live processes under name, at the last refresh
	// The refreshing goroutine's only: when the last prune ran; each other
	// holder of the name with the expiry it had when first seen; the
	// holders reported as sharing.
	lastPrune time.Time
	seen      map[string]time.Time
	others    []string
}

// Claim returns the consumer name of a process of service with explicit
// name (may be ""), claiming one through pr when it is "" (bounded by
// 2 s):
// "<service>-<hostname>-<n>" with the lowest n no live process of the
// group holds. With Redis unreachable at start the name is
// "<service>-<hostname>-p<pid>" (unique on the host; pending entries a
// process leaves under it are taken over by the others after the lock
// duration, and the prune deletes it later).
func Claim(ctx context.Context, pr *presence.Process, service, explicit string, log *slog.Logger) string {
	if explicit != "" {
		return explicit
	}
	host, _ := os.Hostname()
	base := service + "-" + host
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	name, err := pr.Claim(cctx, base)
	if err != nil {
		name = base + "-p" + strconv.Itoa(os.Getpid())
		log.Warn("could not claim a consumer name (redis down?); using one unique on this host", "consumer", name, "err", err)
	}
	return name
}

// NewKeeper returns the Keeper of name in pr; lock is the queue's lock
// duration (a consumer idle for 10 × lock, at least 10 min, with nothing
// pending and no live process, is pruned).
func NewKeeper(pr *presence.Process, name string, lock time.Duration, log *slog.Logger) *Keeper {
	return &Keeper{p: pr, name: name, pruneIdle: max(pruneIdleMin, 10*lock),
		log:  log.With("component", "chat.presence", "consumer", name, "instance", pr.Instance()),
		life: service.Lifecycle{Name: "chat: consumer presence"}}
}

// Shared returns how many other live processes used this process's
// consumer name at the last refresh. Safe for concurrent use.
func (s *Keeper) Shared() int64 { return s.shared.Load() }

// runOnce refreshes the presence, reports a change in who else shares the
// name, and prunes when due. Another holder counts as sharing once it has
// refreshed since this process first saw it: the entry of a predecessor
// that died (kill -9, then a restart under the same --consumer-name) stays
// until its ttl without ever being refreshed, and is no clash.
func (s *Keeper) runOnce(ctx context.Context) error {
	holders, err := s.p.Beat(ctx, s.name)
	if err != nil {
		return err
	}
	seen := make(map[string]time.Time, len(holders))
	var others []string
	for _, h := range holders {
		first, ok := s.seen[h.Instance]
		if !ok {
			first = h.Expires
		}
		seen[h.Instance] = first
		if h.Expires.After(first) {
			others = append(others, h.Instance)
		}
	}
	s.seen = seen
	s.shared.Store(int64(len(others)))
	if !slices.Equal(others, s.others) {
		if len(others) > 0 {
			s.log.Warn("CONSUMER NAME SHARED: other live processes consume under this process's consumer name, "+
				"so they share one pending list; give each process its own --consumer-name, or leave it unset for a unique one",
				"others", others)
		} else {
			s.log.Info("consumer name no longer shared")
		}
		s.others = others
	}
	if time.Since(s.lastPrune) >= pruneEvery {
		s.lastPrune = time.Now()
		gone, err := s.p.PruneGone(ctx, s.pruneIdle)
		if err != nil {
			return fmt.Errorf("pruning gone consumers: %w", err)
		}
		if len(gone) > 0 {
			s.log.Info("deleted consumers that are gone (nothing pending, idle, no live process)", "consumers", gone, "idle_at_least", s.pruneIdle)
		}
	}
	return nil
}

// Start refreshes the presence at once and then every ttl/3 until Stop; a
// failed refresh is logged and retried.
func (s *Keeper) Start(ctx context.Context) error {
	return s.life.Start(ctx, func(run *service.Run) {
		run.Every(0, func(ctx context.Context) time.Duration {
			if err := s.runOnce(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("refreshing the consumer presence failed; retried", "err", err, "every", s.p.TTL()/3)
			}
			return s.p.TTL() / 3
		})
	})
}

// Stop stops the refreshes and leaves the presence set (best effort: a
// process that cannot reach Redis is gone from it after the ttl).
func (s *Keeper) Stop(ctx context.Context) error {
	err := s.life.Stop(ctx)
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	if lerr := s.p.Leave(lctx, s.name); lerr != nil {
		s.log.Debug("leaving the consumer presence failed; it expires", "err", lerr)
	}
	return err
}
