// Package revocations keeps the API's set of revoked users and tokens
// (auth.Revocations) up to date from the database, where `outboxchat
// revoke` writes them.
package revocations

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/chat/auth"
	"github.com/outboxchat/outboxchat/internal/service"
)

// poll is how often the api role reads new rows of its
// revoked_tokens table: a revocation takes effect on every API process
// within about this long (and open sockets of a revoked token are closed
// then), for one indexed query per second per process, none per request.
const poll = time.Second

// Reader keeps the verifier's revocation set (auth.Revocations) up to
// date from <service>.revoked_tokens (`outboxchat revoke` writes it): the
// first read in Start, before the API serves, then every second the rows
// whose version is above the last seen. A service (Start/Stop,
// internal/service) with a RunOnce a test can call; RunOnce must not run
// concurrently with itself or the started service.
type Reader struct {
	pool    *pgxpool.Pool
	set     *auth.Revocations
	sql     string
	log     *slog.Logger
	life    service.Lifecycle
	version int64 // the highest version read; the RunOnce caller's only
}

// New returns the Reader of service svc's revoked_tokens table on pool
// into set.
func New(pool *pgxpool.Pool, svc string, set *auth.Revocations, log *slog.Logger) *Reader {
	return &Reader{pool: pool, set: set, log: log.With("component", "chat.revocations"),
		life: service.Lifecycle{Name: "chat: token revocations"},
		// The version index keeps this an index range scan of the new rows
		// (none, nearly always).
		sql: "SELECT kind, value, revoked_at, version FROM " + pgx.Identifier{svc, "revoked_tokens"}.Sanitize() +
			" WHERE version > $1 ORDER BY version"}
}

// RunOnce adds the rows written since the last read to the set and
// returns how many. Error: the read failed (wrapped; nothing added).
func (r *Reader) RunOnce(ctx context.Context) (int, error) {
	rows, err := r.pool.Query(ctx, r.sql, r.version)
	if err != nil {
		return 0, fmt.Errorf("chat: reading revocations: %w", err)
	}
	var version int64
	rs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (auth.Revocation, error) {
		var rv auth.Revocation
		err := row.Scan(&rv.Kind, &rv.Value, &rv.RevokedAt, &version)
		return rv, err
	})
	if err != nil {
		return 0, fmt.Errorf("chat: reading revocations: %w", err)
	}
	if len(rs) == 0 {
		return 0, nil
	}
	r.set.Add(rs...)
	r.version = version
	r.log.Info("revocations read", "new", len(rs), "revoked", r.set.Len())
	return len(rs), nil
}

// Start reads once (bounded by 5 s; a failure is logged) before it
// returns, then every second until Stop.
func (r *Reader) Start(ctx context.Context) error {
	return r.life.Start(ctx, func(run *service.Run) {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if _, err := r.RunOnce(rctx); err != nil {
			r.log.Warn("reading revocations failed; retried every second", "err", err)
		}
		cancel()
		run.Every(poll, func(ctx context.Context) time.Duration {
			if _, err := r.RunOnce(ctx); err != nil && ctx.Err() == nil {
				r.log.Warn("reading revocations failed; retried", "err", err, "every", poll)
			}
			return poll
		})
	})
}

// Stop stops the reads.
func (r *Reader) Stop(ctx context.Context) error { return r.life.Stop(ctx) }
