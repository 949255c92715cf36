package outbox

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/outbox/internal/outboxsql"
)

// ErrInvalidConfig is wrapped by NewWriter and NewRelay when a Config field is
// invalid (bad table or channel name, missing Publisher, negative duration).
var ErrInvalidConfig = errors.New("invalid config")

// parseTable validates name as ident or schema.ident, each part matching
// [a-z_][a-z0-9_]* and at most 63 bytes long; errors wrap ErrInvalidConfig.
func parseTable(name string) (outboxsql.Table, error) {
	t, err := outboxsql.ParseTable(name)
	if err != nil {
		return t, fmt.Errorf("%w: %w", err, ErrInvalidConfig)
	}
	return t, nil
}

// defaultChannel returns ch, or when a Config leaves it empty the table
// name with '.' replaced by '_' ("" for an invalid name).
func defaultChannel(ch, name string) string {
	if t, err := parseTable(name); ch == "" && err == nil {
		return t.Flat
	}
	return ch
}

// checkNotNegative returns an error wrapping ErrInvalidConfig that names
// the first negative of vals; names holds their names, space-separated.
func checkNotNegative(names string, vals ...time.Duration) error {
	for i, name := range strings.Fields(names) {
		if vals[i] < 0 {
			return fmt.Errorf("negative %s: %w", name, ErrInvalidConfig)
		}
	}
	return nil
}

// checkChannel validates a NOTIFY channel name: 1 to 63 bytes, no NUL;
// errors wrap ErrInvalidConfig.
func checkChannel(ch string) error {
	if err := outboxsql.CheckChannel(ch); err != nil {
		return fmt.Errorf("%w: %w", err, ErrInvalidConfig)
	}
	return nil
}

// TableDDL returns the CREATE TABLE and CREATE INDEX statements (separated by
// ";\n", ending in ";\n") for an outbox table named table, which must be
// "ident" or "schema.ident" with each part matching [a-z_][a-z0-9_]* (at most
// 63 bytes). The schema must already exist. Include the result in a migration:
//
//	CREATE TABLE <table> (
//	  id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
//	  event           text        NOT NULL,
//	  idempotency_key text        NOT NULL,
//	  payload         jsonb       NOT NULL,
//	  created_at      timestamptz NOT NULL DEFAULT now(),
//	  sent_at         timestamptz,
//	  attempts        integer     NOT NULL DEFAULT 0,
//	  last_error      text,
//	  failures        integer     NOT NULL DEFAULT 0,
//	  retry_at        timestamptz,
//	  parked_at       timestamptz,
//	  headers         jsonb
//	);
//	CREATE INDEX <table with '.' as '_'>_unsent ON <table> (id) WHERE sent_at IS NULL;
//
// The partial index keeps the relay's claim query cheap however many sent
// rows the table holds. attempts counts every failed pass that claimed the
// row; failures those the Publisher blamed on the row itself
// (MessageError), retry_at is when it may be tried again and parked_at when
// it was parked (RelayConfig.MaxAttempts); headers holds Event.Headers
// (NULL when none). A table made from an earlier TableDDL needs ParkingDDL
// (without failures, retry_at and parked_at) and HeadersDDL (without
// headers), in that order. TableDDL panics if table is invalid: the name is a
// constant of the calling program, so an invalid one is a programming error.
func TableDDL(table string) string {
	t, err := parseTable(table)
	if err != nil {
		panic("outbox: TableDDL: " + err.Error())
	}
	idx := pgx.Identifier{t.Flat + "_unsent"}.Sanitize()
	return "CREATE TABLE " + t.Quoted + ` (
  id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  event           text        NOT NULL,
  idempotency_key text        NOT NULL,
  payload         jsonb       NOT NULL,
  created_at      timestamptz NOT NULL DEFAULT now(),
  sent_at         timestamptz,
  attempts        integer     NOT NULL DEFAULT 0,
  last_error      text,
  failures        integer     NOT NULL DEFAULT 0,
  retry_at        timestamptz,
  parked_at       timestamptz,
  headers         jsonb
);
CREATE INDEX ` + idx + " ON " + t.Quoted + " (id) WHERE sent_at IS NULL;\n"
}

// ParkingDDL returns the ALTER TABLE statement (ending in ";\n") that adds
// the columns poison handling needs (failures, retry_at, parked_at; see
// TableDDL) to an outbox table created by an earlier TableDDL. Include it
// in a migration. It panics if table is invalid, as TableDDL does.
func ParkingDDL(table string) string {
	t, err := parseTable(table)
	if err != nil {
		panic("outbox: ParkingDDL: " + err.Error())
	}
	return "ALTER TABLE " + t.Quoted + `
  ADD COLUMN failures  integer NOT NULL DEFAULT 0,
  ADD COLUMN retry_at  timestamptz,
  ADD COLUMN parked_at timestamptz;
`
}

// HeadersDDL returns the ALTER TABLE statement (ending in ";\n") that adds
// the headers column (jsonb, NULL when an event has none; see TableDDL) to
// an outbox table created by an earlier TableDDL. Include it in a
// migration before running a Writer or Relay of this version: both name the
// column. Adding a nullable column without a default rewrites nothing, so
// it is quick on a large table (it takes a brief ACCESS EXCLUSIVE lock). It
// panics if table is invalid, as TableDDL does.
func HeadersDDL(table string) string {
	t, err := parseTable(table)
	if err != nil {
		panic("outbox: HeadersDDL: " + err.Error())
	}
	return "ALTER TABLE " + t.Quoted + " ADD COLUMN headers jsonb;\n"
}
