package schema

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/chat"
)

// EnsurePartitions creates the outbox tables of partitions 1 … n-1 of
// service that do not exist yet ("<service>.outbox_p<p>", chat.OutboxTable),
// each LIKE "<service>.outbox" INCLUDING ALL (columns, defaults, identity,
// the partial index of unsent rows), and the lease rows of partitions
// 0 … n-1 (<service>.partition_leases, migration 015). Partition 0 is
// "<service>.outbox" itself, so n = 1 creates nothing but its lease row.
// Tables of partitions ≥ n are kept (a drained deployment that lowered n
// leaves them empty; `outboxchat status` reports rows left in them). It
// runs after Migrate, in one transaction under the migrations' advisory
// lock, as the service's role. Errors: an unknown service, n out of range
// (chat.CheckPartitions), the database's.
func EnsurePartitions(ctx context.Context, pool *pgxpool.Pool, service string, n int) error {
	if err := chat.CheckService(service); err != nil {
		return err
	}
	if err := chat.CheckPartitions(n); err != nil {
		return err
	}
	schema := pgx.Identifier{service}.Sanitize()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := lockMigrations(ctx, tx, service); err != nil {
			return err
		}
		if err := actAsService(ctx, tx, service); err != nil {
			return err
		}
		for p := 1; p < n; p++ {
			t := pgx.Identifier{service, "outbox_p" + strconv.Itoa(p)}.Sanitize()
			if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+t+` (LIKE `+schema+`.outbox INCLUDING ALL)`); err != nil {
				return fmt.Errorf("create %s: %w", t, err)
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+schema+`.partition_leases (partition)
			SELECT generate_series(0, $1 - 1) ON CONFLICT DO NOTHING`, n)
		return err
	})
	if err != nil {
		return fmt.Errorf("partitions %s: %w", service, err)
	}
	return nil
}

// PartitionTables lists the partitions whose outbox tables exist in
// service's schema, ascending: 0 ("<service>.outbox") and every p of a
// "<service>.outbox_p<p>". Readers that do not know the deployment's
// partition count (`outboxchat status`, `trace`) look at all of them.
func PartitionTables(ctx context.Context, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, service string) ([]int, error) {
	rows, err := db.Query(ctx, `SELECT substr(tablename, 9)::int AS p FROM pg_tables
		WHERE schemaname = $1 AND tablename ~ '^outbox_p[0-9]+$' ORDER BY 1`, service)
	if err != nil {
		return nil, fmt.Errorf("list partition tables: %w", err)
	}
	ps, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, fmt.Errorf("list partition tables: %w", err)
	}
	return append([]int{0}, ps...), nil
}
