// Package lease spreads a service's outbox partitions over its relay
// processes with leases held in Postgres, in the style of River's leader
// election (riverqueue/river internal/leadership): rows with an owner and
// an expiry on the database clock, taken and renewed by plain statements,
// so it works through PgBouncer in transaction mode (no session advisory
// locks, no LISTEN needed).
//
// Tables (migration 015): <service>.partition_leases (partition, owner,
// expires_at), one row per partition, and <service>.partition_members
// (owner, expires_at), one row per live process. Every TTL/3 a Manager
// renews its member row and its leases, counts the live members and
// computes its fair share: Partitions / members, the first
// Partitions mod members owners (by name) taking one more. It then
// releases the leases above its share (stopping their work first) and
// takes free or expired ones up to it (FOR UPDATE SKIP LOCKED, so two
// managers never take one row at once). A process joining is counted at
// once, so the others give up partitions within a tick and it takes them
// within the next; a process leaving releases on a graceful stop (the
// others take them within a tick); one killed leaves leases that expire
// after TTL and are taken within a tick after that.
//
// A Manager whose renewal fails past its leases' expiry (by its own clock,
// measured from the start of the last renewal that succeeded), or whose
// renewal finds a lease taken by another owner, stops that work at once.
//
// Correctness must never depend on a lease: the work it guards (an outbox
// relay) must be safe when two processes run it for a while (a paused
// process wakes after its lease expired and before its next renewal).
package lease

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/internal/service"
)

// DefaultTTL is Config.TTL's default: how long a lease lasts unless
// renewed. A killed process's partitions are taken over within about
// TTL + TTL/3.
const DefaultTTL = 10 * time.Second

// minTTL bounds Config.TTL from below: a renewal is a transaction every
// TTL/3, which must fit in it with room to spare.
const minTTL = 300 * time.Millisecond

// Config configures New. Service, Owner, Partitions, Acquired and
// Released are required.
type Config struct {
	// Service is chat.Consumers or chat.Workers: the schema of the lease
	// tables.
	Service string
	// Owner names this process among the live ones; two live managers
	// must not share one (each would renew the other's leases). The
	// server uses the consumer name plus a random suffix.
	Owner string
	// Partitions is the number of partitions (leases 0 … Partitions-1;
	// schema.EnsurePartitions inserts their rows).
	Partitions int
	// TTL is how long a lease (and a member row) lasts unless renewed;
	// renewals run every TTL/3. Default DefaultTTL (10 s); at least
	// 300 ms.
	TTL time.Duration
	// Acquired starts the work of partition p (a relay) under ctx, which a
	// hard stop of the Manager cancels. Called from the Manager's
	// goroutine, never concurrently; it must not block for long.
	Acquired func(ctx context.Context, p int)
	// Released stops the work of partition p and returns once it has
	// stopped (or ctx ended). Called from the Manager's goroutine before
	// the lease is given up, and when it was lost.
	Released func(ctx context.Context, p int)
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// Manager takes, renews and releases one process's leases. It is a
// service (Start/Stop; RunOnce runs one round). Held is safe for
// concurrent use; RunOnce must not run concurrently with a started
// Manager's loop.
type Manager struct {
	pool *pgxpool.Pool
	cfg  Config
	log  *slog.Logger
	life service.Lifecycle
	q    queries

	mu   sync.Mutex
	held map[int]bool
	// validUntil is when the leases held expire by this process's clock:
	// the start of the last successful renewal plus TTL.
	validUntil time.Time
}

type queries struct {
	join, renew, live, release, acquire, leave string
}

// New validates cfg and returns a Manager on pool. Errors: nil pool or
// cfg, an unknown service, no Owner, Partitions out of range, TTL below
// 300 ms, nil Acquired or Released.
func New(pool *pgxpool.Pool, cfg *Config) (*Manager, error) {
	if pool == nil || cfg == nil {
		return nil, errors.New("lease: New needs a pool and a config")
	}
	c := *cfg
	c.TTL = cmp.Or(c.TTL, DefaultTTL)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	if err := chat.CheckService(c.Service); err != nil {
		return nil, err
	}
	if err := chat.CheckPartitions(c.Partitions); err != nil {
		return nil, err
	}
	switch {
	case c.Owner == "":
		return nil, errors.New("lease: Owner is required")
	case c.TTL < minTTL:
		return nil, fmt.Errorf("lease: TTL %v below %v", c.TTL, minTTL)
	case c.Acquired == nil || c.Released == nil:
		return nil, errors.New("lease: Acquired and Released are required")
	}
	l := pgx.Identifier{c.Service, "partition_leases"}.Sanitize()
	m := pgx.Identifier{c.Service, "partition_members"}.Sanitize()
	return &Manager{pool: pool, cfg: c, held: map[int]bool{},
		log:  c.Logger.With("component", "chat.lease", "owner", c.Owner),
		life: service.Lifecycle{Name: "chat: partition leases"},
		q: queries{
			// The member row says this process is live for a TTL; rows of
			// members gone for a TTL are dropped on the way.
			join: `WITH d AS (DELETE FROM ` + m + ` WHERE expires_at < now() - $2::interval)
				INSERT INTO ` + m + ` (owner, expires_at) VALUES ($1, now() + $2::interval)
				ON CONFLICT (owner) DO UPDATE SET expires_at = excluded.expires_at`,
			// Renewing a lease of ours even if it expired: nobody took it.
			renew: `UPDATE ` + l + ` SET expires_at = now() + $2::interval
				WHERE owner = $1 AND partition < $3 RETURNING partition`,
			live: `SELECT owner FROM ` + m + ` WHERE expires_at > now() ORDER BY owner`,
			release: `UPDATE ` + l + ` SET owner = NULL, expires_at = '-infinity'
				WHERE owner = $1 AND partition = ANY($2::int[])`,
			// Free (no owner) or expired leases, lowest partition first;
			// SKIP LOCKED: another manager is taking that row right now.
			acquire: `UPDATE ` + l + ` l SET owner = $1, expires_at = now() + $2::interval
				FROM (SELECT partition FROM ` + l + `
					WHERE partition < $3 AND (owner IS NULL OR expires_at < now())
					ORDER BY partition LIMIT $4 FOR UPDATE SKIP LOCKED) f
				WHERE l.partition = f.partition RETURNING l.partition`,
			leave: `WITH r AS (UPDATE ` + l + ` SET owner = NULL, expires_at = '-infinity' WHERE owner = $1)
				DELETE FROM ` + m + ` WHERE owner = $1`,
		}}, nil
}

// Held returns the partitions this Manager holds (and whose work runs),
// ascending.
func (m *Manager) Held() []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]int, 0, len(m.held))
	for p := range m.held {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// share is the fair share of the member at rank (0-based, by owner) among
// live members, of n partitions: n/live, plus one for the first n mod live.
func share(n, live, rank int) int {
	if live <= 0 {
		return n
	}
	s := n / live
	if rank < n%live {
		s++
	}
	return s
}

// RunOnce runs one round: join (renew the member row), renew the leases,
// stop the work of the ones lost, release those above the fair share and
// take free or expired ones up to it. ctx is the work's context for
// partitions taken (Config.Acquired). On an error the round stops there;
// work whose leases have expired by this process's clock is stopped.
func (m *Manager) RunOnce(ctx context.Context) error {
	start := time.Now()
	ttl := m.cfg.TTL
	n := m.cfg.Partitions
	var renewed []int
	var owners []string
	err := pgx.BeginFunc(ctx, m.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, m.q.join, m.cfg.Owner, ttl); err != nil {
			return fmt.Errorf("join: %w", err)
		}
		rows, err := tx.Query(ctx, m.q.renew, m.cfg.Owner, ttl, n)
		if err != nil {
			return fmt.Errorf("renew: %w", err)
		}
		if renewed, err = pgx.CollectRows(rows, pgx.RowTo[int]); err != nil {
			return fmt.Errorf("renew: %w", err)
		}
		rows, err = tx.Query(ctx, m.q.live)
		if err != nil {
			return fmt.Errorf("live members: %w", err)
		}
		owners, err = pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("live members: %w", err)
		}
		return nil
	})
	if err != nil {
		m.expire(ctx)
		return fmt.Errorf("lease: %w", err)
	}
	m.mu.Lock()
	m.validUntil = start.Add(ttl)
	m.mu.Unlock()
	// Lost: held here, not renewed (another owner took it after it
	// expired).
	for _, p := range m.Held() {
		if !slices.Contains(renewed, p) {
			m.log.Warn("partition lease lost to another process; its relay stops", "partition", p)
			m.drop(ctx, p)
		}
	}
	// Renewed but not running here (a restart under the same owner name):
	// run it.
	for _, p := range renewed {
		m.take(ctx, p)
	}
	want := share(n, len(owners), max(slices.Index(owners, m.cfg.Owner), 0))
	held := m.Held()
	if len(held) > want {
		extra := held[want:]
		for _, p := range extra {
			m.drop(ctx, p)
		}
		if _, err := m.pool.Exec(ctx, m.q.release, m.cfg.Owner, extra); err != nil {
			return fmt.Errorf("lease: release: %w", err)
		}
		m.log.Info("partition leases released (over the fair share)", "partitions", extra, "share", want, "members", len(owners))
		return nil
	}
	if len(held) < want {
		rows, err := m.pool.Query(ctx, m.q.acquire, m.cfg.Owner, ttl, n, want-len(held))
		if err != nil {
			return fmt.Errorf("lease: acquire: %w", err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[int])
		if err != nil {
			return fmt.Errorf("lease: acquire: %w", err)
		}
		for _, p := range got {
			m.take(ctx, p)
		}
		if len(got) > 0 {
			m.log.Info("partition leases taken", "partitions", got, "share", want, "members", len(owners))
		}
	}
	return nil
}

// take starts partition p's work unless it runs.
func (m *Manager) take(ctx context.Context, p int) {
	m.mu.Lock()
	had := m.held[p]
	m.held[p] = true
	m.mu.Unlock()
	if !had {
		m.cfg.Acquired(ctx, p)
	}
}

// drop stops partition p's work.
func (m *Manager) drop(ctx context.Context, p int) {
	m.mu.Lock()
	had := m.held[p]
	delete(m.held, p)
	m.mu.Unlock()
	if had {
		m.cfg.Released(ctx, p)
	}
}

// expire stops all the work once the leases have expired by this
// process's clock (renewals failing: another process may hold them now).
func (m *Manager) expire(ctx context.Context) {
	m.mu.Lock()
	expired := !m.validUntil.IsZero() && !time.Now().Before(m.validUntil)
	m.mu.Unlock()
	if !expired {
		return
	}
	held := m.Held()
	if len(held) > 0 {
		m.log.Warn("partition leases expired without renewal; their relays stop", "partitions", held)
	}
	for _, p := range held {
		m.drop(ctx, p)
	}
}

// Start runs the rounds every TTL/3 (the first at once) until Stop or a
// hard stop. A graceful Stop stops the work of every partition held, then
// releases the leases and the member row, so others take them at their
// next round; a hard stop (Start's ctx cancelled) cancels the work's
// context and releases nothing: the leases expire after TTL. Errors:
// service.ErrAlreadyStarted (wrapped) while a run is in progress,
// ctx.Err().
func (m *Manager) Start(ctx context.Context) error {
	return m.life.Start(ctx, func(run *service.Run) {
		run.Go(func() { m.loop(run) })
	})
}

func (m *Manager) loop(run *service.Run) {
	ctx := run.Context()
	every := m.cfg.TTL / 3
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-run.Stopping():
			if ctx.Err() != nil {
				return // hard stop: the work's context is cancelled, leases expire
			}
			m.leave(run.DrainContext())
			return
		case <-t.C:
		}
		if err := m.RunOnce(ctx); err != nil && ctx.Err() == nil {
			m.log.Warn("partition lease round failed; retried", "err", err)
		}
		next := every
		m.mu.Lock()
		if len(m.held) > 0 && !m.validUntil.IsZero() {
			// After failures, try again in time to stop the work when
			// the leases expire.
			next = max(min(next, time.Until(m.validUntil)), 10*time.Millisecond)
		}
		m.mu.Unlock()
		t.Reset(next)
	}
}

// leave stops every partition's work and gives its leases and member row
// up.
func (m *Manager) leave(ctx context.Context) {
	for _, p := range m.Held() {
		m.drop(ctx, p)
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := m.pool.Exec(cctx, m.q.leave, m.cfg.Owner); err != nil {
		m.log.Warn("releasing the partition leases failed; they expire after the TTL", "err", err, "ttl", m.cfg.TTL)
		return
	}
	m.log.Info("partition leases released (stopping)")
}

// Stop stops gracefully (see Start) and waits. Idempotent; nil when not
// running.
func (m *Manager) Stop(ctx context.Context) error { return m.life.Stop(ctx) }
