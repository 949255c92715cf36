package schema

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Running behind a connection pooler (README "Deploying on managed
// Postgres"). PgBouncer in transaction mode hands each transaction of a
// client to any server connection of its pool, so nothing may outlive a
// transaction on the server side:
//
//   - startup parameters: PgBouncer refuses the ones it does not track
//     ("unsupported startup parameter"), so plan_cache_mode is SET after
//     connecting (PlanCacheSetup) instead;
//   - prepared statements: pgx's default query mode (cache_statement)
//     prepares each statement once per connection by name; before
//     PgBouncer 1.21 (or with max_prepared_statements = 0) the next
//     transaction may reach a server connection that never saw it
//     (SQLSTATE 26000) or one that already has that name (42P05).
//     default_query_exec_mode=exec in the URL uses unnamed statements;
//     CheckPooler refuses to start without it behind such a pooler;
//   - LISTEN: notifications go to a server connection the client no longer
//     holds; --listen-database-url gives the notifier a direct (or
//     session-mode) URL, and its self-check warns when LISTEN does not work.
//
// Everything else the services do is per transaction (advisory locks are
// pg_advisory_xact_lock, settings SET LOCAL), migrations included.

// ErrTransactionPooler is returned by Serve when the database URL reaches
// Postgres through a pooler in transaction mode that does not keep
// prepared statements (PgBouncer before 1.21, or max_prepared_statements =
// 0) and the URL keeps pgx's default query mode, which relies on them.
var ErrTransactionPooler = errors.New("chat: the database URL goes through a connection pooler in transaction mode " +
	"(e.g. PgBouncer pool_mode = transaction) that does not keep prepared statements across transactions: " +
	"add default_query_exec_mode=exec to --database-url (or, with PgBouncer 1.21 or later, set max_prepared_statements = 200 in pgbouncer.ini)")

// planCacheMode is the plan_cache_mode every pooled session gets. Every
// statement of the service is a short index lookup or insert whose best
// plan does not depend on its parameters, but Postgres re-plans a prepared
// statement with custom plans while they look cheaper, which for the
// gateway's LATERAL read cost 0.5 ms of planning against 0.2 ms with a
// generic plan.
const planCacheMode = "force_generic_plan"

// PlanCacheSetup returns the statement to run on each new connection of
// pcfg's pool: "SET plan_cache_mode = force_generic_plan", or "" when the
// URL sets plan_cache_mode itself (then it is sent as a startup parameter,
// which PgBouncer refuses unless listed in its ignore_startup_parameters).
// A SET, unlike the startup parameter it replaces, passes any pooler: in
// transaction mode it lands on one server connection of the service role's
// pool and stays there, which only changes plans of that same role's
// statements (and none in exec mode, whose unnamed statements are planned
// for their parameters each time).
func PlanCacheSetup(pcfg *pgxpool.Config) string {
	if _, ok := pcfg.ConnConfig.RuntimeParams["plan_cache_mode"]; ok {
		return ""
	}
	return "SET plan_cache_mode = " + planCacheMode
}

// poolerProbeTimeout bounds CheckPooler.
const poolerProbeTimeout = 5 * time.Second

// CheckPooler returns ErrTransactionPooler when pool's connections lose
// their prepared statements between transactions and pool uses pgx's
// default query mode (cache_statement); other modes are not probed. The
// probe: client connection A opens a transaction (the pooler gives it
// server connection S1), client B prepares a statement (S2, as S1 is busy),
// A commits (S1 is idle last), B runs its statement: PgBouncer reuses
// server connections last-in first-out, so B's statement reaches S1, where
// it does not exist. Directly, in session mode and with PgBouncer's
// prepared statement support, B's session keeps it and the probe passes.
// A pooler that hands out server connections in another order can pass
// the probe and fail later: the README names the URL option either way.
// With pool_max_conns=1 there is no probe; a probe that cannot finish
// (the pooler has one server connection) logs a warning and returns nil.
// A pool that cannot connect gives "connect to postgres: " and pgx's
// *pgconn.ConnectError; any other failed probe "probe for a connection
// pooler: " and its error.
//
// Serve calls it at start; `outboxchat migrate` too. log (nil: slog.Default)
// receives the warning. Safe for concurrent use; it holds two of pool's
// connections for at most 5 s.
func CheckPooler(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) error {
	if log == nil {
		log = slog.Default()
	}
	if pool.Config().ConnConfig.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement || pool.Config().MaxConns < 2 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, poolerProbeTimeout)
	defer cancel()
	err := probePooler(ctx, pool)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &pgErr) && (pgErr.Code == "26000" || pgErr.Code == "42P05"):
		return ErrTransactionPooler
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		log.Warn("could not tell whether the database URL goes through a transaction-mode pooler (probe timed out); "+
			"if it does, add default_query_exec_mode=exec to it", "err", err)
		return nil
	case errors.As(err, new(*pgconn.ConnectError)):
		return fmt.Errorf("connect to postgres: %w", err)
	default:
		return fmt.Errorf("probe for a connection pooler: %w", err)
	}
}

func probePooler(ctx context.Context, pool *pgxpool.Pool) error {
	a, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer a.Release()
	b, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// B's prepared statement is its own: close the connection after the
	// probe rather than leave the name in its statement map (and, behind a
	// pooler, on a server connection).
	defer func() {
		_ = b.Conn().Close(context.WithoutCancel(ctx))
		b.Release()
	}()
	tx, err := a.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
		return err
	}
	const name = "outboxchat_pooler_probe"
	if _, err := b.Conn().Prepare(ctx, name, "SELECT 1"); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	_, err = b.Exec(ctx, name)
	return err
}

// ListenConnConfig returns the notifier's connection settings: those of
// listenURL (pool_* parameters dropped) when set, else the pool's.
func ListenConnConfig(listenURL string, pool *pgxpool.Pool) (*pgx.ConnConfig, error) {
	if listenURL == "" {
		return pool.Config().ConnConfig, nil
	}
	pc, err := pgxpool.ParseConfig(listenURL)
	if err != nil {
		return nil, fmt.Errorf("serve: listen database url: %w", err)
	}
	return pc.ConnConfig, nil
}
