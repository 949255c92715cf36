package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/outbox/internal/outboxsql"
)

// DB is what the functions below need of a pgx connection, pool or
// transaction (*pgxpool.Pool, *pgx.Conn and pgx.Tx have it).
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Stats is a snapshot of an outbox table.
type Stats struct {
	// Unsent is the number of rows not yet published and not parked.
	Unsent int64
	// OldestUnsent is the age of the oldest of them (its created_at), by
	// the database clock; 0 when there is none.
	OldestUnsent time.Duration
	// Parked is the number of parked rows (see RelayConfig.MaxAttempts).
	Parked int64
}

// ReadStats reads table's Stats with one statement (a count over the
// unsent rows, which are all the table holds: the relay deletes what it
// published). table is "ident" or "schema.ident" as for TableDDL; an
// invalid name wraps ErrInvalidConfig. The caller's role needs SELECT on
// the table. Safe for concurrent use.
func ReadStats(ctx context.Context, db DB, table string) (Stats, error) {
	t, err := parseTable(table)
	if err != nil {
		return Stats{}, fmt.Errorf("outbox: stats: %w", err)
	}
	var s Stats
	var age float64
	err = db.QueryRow(ctx, t.StatsSQL()).Scan(&s.Unsent, &s.Parked, &age)
	if err != nil {
		return Stats{}, fmt.Errorf("outbox: stats of %s: %w", table, err)
	}
	s.OldestUnsent = time.Duration(max(age, 0) * float64(time.Second))
	return s, nil
}

// ParkedRow is one parked outbox row.
type ParkedRow struct {
	// RowID is the row's id; ID its idempotency key (the chat's message
	// id); Event and Payload as enqueued.
	RowID   int64
	ID      string
	Event   string
	Payload []byte
	// CreatedAt is when it was enqueued, ParkedAt when it was parked
	// (database clock).
	CreatedAt, ParkedAt time.Time
	// Attempts counts every failed pass that claimed it, Failures those
	// blamed on the row itself; LastError is the last failure's text.
	Attempts, Failures int
	LastError          string
}

// Parked returns up to limit parked rows of table in id order (limit ≤ 0:
// all). Errors: an invalid table name (wrapping ErrInvalidConfig), query
// errors. Safe for concurrent use.
func Parked(ctx context.Context, db DB, table string, limit int) ([]ParkedRow, error) {
	t, err := parseTable(table)
	if err != nil {
		return nil, fmt.Errorf("outbox: parked: %w", err)
	}
	var lim *int
	if limit > 0 {
		lim = &limit
	}
	rows, err := db.Query(ctx, t.ParkedSQL(), lim)
	if err != nil {
		return nil, fmt.Errorf("outbox: parked rows of %s: %w", table, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ParkedRow, error) {
		var p ParkedRow
		err := r.Scan(&p.RowID, &p.ID, &p.Event, &p.Payload, &p.CreatedAt, &p.ParkedAt, &p.Attempts, &p.Failures, &p.LastError)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: parked rows of %s: %w", table, err)
	}
	return out, nil
}

// Retried is one row Retry put back: the parked row's id and idempotency
// key, and the id of the row that replaced it.
type Retried struct {
	OldRowID, NewRowID int64
	ID                 string
}

// Retry puts parked rows of table back in line: in one transaction each is
// deleted and enqueued again as a new row (new id, so it sorts after every
// row already enqueued: the claim floor of a running relay has passed the
// old id; failures, retry_at and parked_at cleared; attempts, last_error
// and created_at kept), and channel (the relays' LISTEN channel; "" = none)
// is notified. rowIDs selects the rows; nil or empty retries every parked
// row. Ids that are not parked rows (already retried, published, unknown)
// are skipped, so a repeated Retry is a no-op: the result lists only the
// rows retried now, in old id order. Errors: an invalid table name
// (wrapping ErrInvalidConfig), database errors (nothing is then changed).
// Safe for concurrent use.
func Retry(ctx context.Context, db DB, table, channel string, rowIDs []int64) ([]Retried, error) {
	t, err := parseTable(table)
	if err != nil {
		return nil, fmt.Errorf("outbox: retry: %w", err)
	}
	var sel []int64
	if len(rowIDs) > 0 {
		sel = rowIDs
	}
	var out []Retried
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, outboxsql.XactID); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, t.RetrySQL(), sel)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Retried, error) {
			var x Retried
			err := r.Scan(&x.OldRowID, &x.NewRowID, &x.ID)
			return x, err
		})
		if err != nil {
			return err
		}
		if len(out) > 0 && channel != "" {
			_, err = tx.Exec(ctx, outboxsql.Notify, channel)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: retry parked rows of %s: %w", table, err)
	}
	return out, nil
}
