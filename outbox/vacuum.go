package outbox

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/internal/service"
	"github.com/outboxchat/outboxchat/outbox/internal/outboxsql"
)

// Vacuum keeps an outbox table small: the space of the rows the relay
// deleted comes back only when the table is vacuumed, and autovacuum looks
// at a table at most once per autovacuum_naptime (1 min by default) and
// throttles itself: at thousands of messages a second, a minute is enough
// for the dead rows to outnumber the live ones a hundred to one. Vacuum
// runs VACUUM on the table whenever pg_stat_user_tables shows at least
// DeadRows dead rows, so the space is reused within about an Interval and
// the empty pages at the end are given back (VACUUM's truncation takes the
// table's lock only when nobody waits for it).
//
// A held snapshot (a forgotten transaction's, a long report's, a
// replica's hot_standby_feedback) keeps the dead rows: a VACUUM that
// removes less than half of them doubles the wait before the next, up to
// 16 × Interval, and the wait returns to Interval once one removes most.
//
// Vacuum is a service (Start/Stop) with one RunOnce a test can call; it
// needs the table's owner (VACUUM) and is safe for concurrent use.
type Vacuum struct {
	pool  *pgxpool.Pool
	table outboxsql.Table
	cfg   VacuumConfig
	log   *slog.Logger
	life  service.Lifecycle
}

// Vacuum defaults.
const (
	// DefaultVacuumInterval is VacuumConfig.Interval's default.
	DefaultVacuumInterval = 2 * time.Second
	// DefaultVacuumDeadRows is VacuumConfig.DeadRows's default.
	DefaultVacuumDeadRows = 5_000
)

// VacuumConfig configures NewVacuum. Table is required.
type VacuumConfig struct {
	// Table is the outbox table, as for RelayConfig.
	Table string
	// Interval is how often the statistics are read (one small query).
	// Default 0 means DefaultVacuumInterval (2 s: at 2,700 msg/s about
	// 5,400 rows, 2 MB of heap, die between two checks).
	Interval time.Duration
	// DeadRows is the number of dead rows (pg_stat_user_tables.n_dead_tup)
	// from which a VACUUM is run. Default 0 means DefaultVacuumDeadRows
	// (5,000: about 2 MB of heap for the chat's rows).
	DeadRows int64
	// Vacuumed, when set, is called after each VACUUM with the dead rows
	// before and after it and its duration. Must not block.
	Vacuumed func(before, after int64, d time.Duration)
	// Logger; nil means slog.Default(). A failed run is logged at Warn
	// with component=outbox.vacuum.
	Logger *slog.Logger
}

// NewVacuum validates cfg and returns a stopped Vacuum. Errors wrap
// ErrInvalidConfig: nil pool or cfg, bad Table, negative fields.
func NewVacuum(pool *pgxpool.Pool, cfg *VacuumConfig) (*Vacuum, error) {
	if pool == nil || cfg == nil {
		return nil, fmt.Errorf("outbox: new vacuum: pool and config are required: %w", ErrInvalidConfig)
	}
	c := *cfg
	t, err := parseTable(c.Table)
	if err != nil {
		return nil, fmt.Errorf("outbox: new vacuum: %w", err)
	}
	if c.Interval < 0 || c.DeadRows < 0 {
		return nil, fmt.Errorf("outbox: new vacuum: negative Interval or DeadRows: %w", ErrInvalidConfig)
	}
	c.Interval = cmp.Or(c.Interval, DefaultVacuumInterval)
	c.DeadRows = cmp.Or(c.DeadRows, DefaultVacuumDeadRows)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	return &Vacuum{pool: pool, table: t, cfg: c, log: c.Logger.With(slog.String("component", "outbox.vacuum")),
		life: service.Lifecycle{Name: "outbox: vacuum"}}, nil
}

// RunOnce reads the table's dead rows and, from DeadRows on, vacuums it.
// It returns whether it vacuumed and whether that removed at least half of
// them. Errors: query or VACUUM errors, wrapped.
func (v *Vacuum) RunOnce(ctx context.Context) (vacuumed, removed bool, err error) {
	var before int64
	if err := v.pool.QueryRow(ctx, outboxsql.DeadRows, v.table.Quoted).Scan(&before); err != nil {
		return false, false, fmt.Errorf("outbox: vacuum: read statistics: %w", err)
	}
	if before < v.cfg.DeadRows {
		return false, true, nil
	}
	start := time.Now()
	// VACUUM cannot run in a transaction block; Exec without arguments
	// sends it as a simple query.
	if _, err := v.pool.Exec(ctx, v.table.Vacuum()); err != nil {
		return false, false, fmt.Errorf("outbox: vacuum %s: %w", v.table.Name, err)
	}
	d := time.Since(start)
	var after int64
	if err := v.pool.QueryRow(ctx, outboxsql.DeadRows, v.table.Quoted).Scan(&after); err != nil {
		after = -1
	}
	if v.cfg.Vacuumed != nil {
		v.cfg.Vacuumed(before, after, d)
	}
	v.log.Debug("vacuumed", slog.Int64("dead_before", before), slog.Int64("dead_after", after), slog.Duration("took", d))
	return true, after >= 0 && after <= before/2, nil
}

// Start runs RunOnce every Interval (longer after a VACUUM that removed
// little, see Vacuum) until Stop. It does not block. Errors: wrapping
// service.ErrAlreadyStarted, or ctx.Err().
func (v *Vacuum) Start(ctx context.Context) error {
	return v.life.Start(ctx, func(run *service.Run) {
		wait := v.cfg.Interval
		run.Every(wait, func(ctx context.Context) time.Duration {
			did, removed, err := v.RunOnce(ctx)
			switch {
			case err != nil && ctx.Err() == nil:
				v.log.Warn("vacuum failed; tried again later", slog.Any("err", err))
			case did && !removed:
				wait = min(2*wait, 16*v.cfg.Interval)
				return wait
			}
			wait = v.cfg.Interval
			return wait
		})
	})
}

// Stop ends the loop after a run in flight and waits for it. Idempotent.
func (v *Vacuum) Stop(ctx context.Context) error { return v.life.Stop(ctx) }
