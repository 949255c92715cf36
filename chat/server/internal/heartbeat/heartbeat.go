// Package heartbeat writes the relay role's heartbeat row, which
// `outboxchat status` reads: when the process's relay last committed a
// pass, and whether its LISTEN connection is up.
package heartbeat

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/internal/service"
)

// every is how often the relay role writes its heartbeat row
// (when its relay committed a pass since the last write): one small UPDATE
// per 5 s, not per message, so the row stays cool even under load.
const every = 5 * time.Second

// Writer writes, at most every 5 s, when this process's relay last
// committed a pass into <service>.relay_heartbeat (row name = the
// process's consumer name), on the database clock, and whether its LISTEN
// connection is up (null for a poll-only relay), for `outboxchat status`.
// A service (Start/Stop, internal/service) with a RunOnce a test can call;
// RunOnce must not run concurrently with itself or the started service.
type Writer struct {
	pool     *pgxpool.Pool
	name     string
	lastPass func() time.Time
	// listening reports whether the relay's LISTEN connection is up; nil
	// for a poll-only relay.
	listening func() bool
	sql       string
	log       *slog.Logger
	written   time.Time // the lastPass last written
	life      service.Lifecycle
}

// New returns the heartbeat writer of service svc's relay row name on
// pool: lastPass is the time of the relay's latest committed pass (zero:
// none yet), listening whether its LISTEN connection is up (nil for a
// poll-only relay).
func New(pool *pgxpool.Pool, svc, name string, lastPass func() time.Time, listening func() bool, log *slog.Logger) *Writer {
	return &Writer{pool: pool, name: name, lastPass: lastPass, listening: listening, log: log.With("component", "chat.heartbeat"),
		life: service.Lifecycle{Name: "chat: relay heartbeat"},
		// pass_at on the database clock: now() less how long ago, by this
		// process's clock, the pass committed.
		sql: "INSERT INTO " + pgx.Identifier{svc, "relay_heartbeat"}.Sanitize() + ` (relay, pass_at, listening)
VALUES ($1, now() - $2::bigint * interval '1 microsecond', $3)
ON CONFLICT (relay) DO UPDATE SET pass_at = excluded.pass_at, listening = excluded.listening`}
}

// RunOnce writes the heartbeat if the relay passed since the last write.
// Error: the write failed (wrapped).
func (h *Writer) RunOnce(ctx context.Context) error {
	last := h.lastPass()
	if last.IsZero() || !last.After(h.written) {
		return nil
	}
	var listening *bool
	if h.listening != nil {
		l := h.listening()
		listening = &l
	}
	if _, err := h.pool.Exec(ctx, h.sql, h.name, time.Since(last).Microseconds(), listening); err != nil {
		return fmt.Errorf("chat: relay heartbeat: %w", err)
	}
	h.written = last
	return nil
}

// Start writes the heartbeat a second after start, then every 5 s, until
// Stop; a failed write is logged and retried.
func (h *Writer) Start(ctx context.Context) error {
	return h.life.Start(ctx, func(run *service.Run) {
		// The first write a second after start (the relay's first pass
		// has run by then), then every 5 s.
		run.Every(time.Second, func(ctx context.Context) time.Duration {
			if err := h.RunOnce(ctx); err != nil && ctx.Err() == nil {
				h.log.Warn("writing the relay heartbeat failed; retried in 5 s", "err", err)
			}
			return every
		})
	})
}

// Stop stops the writes.
func (h *Writer) Stop(ctx context.Context) error { return h.life.Stop(ctx) }
