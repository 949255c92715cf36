package outbox

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrInvalidConfig is wrapped by NewWriter and NewRelay when a Config field is
// invalid (bad table or channel name, missing Publisher, negative duration).
var ErrInvalidConfig = errors.New("invalid config")

// identRe matches one unquoted lower-case identifier part.
var identRe = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// maxIdentLen is PostgreSQL's NAMEDATALEN-1: longer names are truncated by
// the server, which would silently make two names equal.
const maxIdentLen = 63

// table is a validated outbox table name.
type table struct {
	name   string // as given: "ident" or "schema.ident"
	quoted string // pgx.Identifier-sanitized, safe to splice into SQL
	flat   string // name with '.' replaced by '_'
}

// parseTable validates name as ident or schema.ident, each part matching
// [a-z_][a-z0-9_]* and at most 63 bytes long.
func parseTable(name string) (table, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return table{}, fmt.Errorf("table %q: want ident or schema.ident: %w", name, ErrInvalidConfig)
	}
	for _, p := range parts {
		if !identRe.MatchString(p) || len(p) > maxIdentLen {
			return table{}, fmt.Errorf("table %q: each part must match [a-z_][a-z0-9_]* and be at most %d bytes: %w",
				name, maxIdentLen, ErrInvalidConfig)
		}
	}
	return table{
		name:   name,
		quoted: pgx.Identifier(parts).Sanitize(),
		flat:   strings.ReplaceAll(name, ".", "_"),
	}, nil
}

// defaultChannel returns ch, or when a Config leaves it empty the table
// name with '.' replaced by '_' ("" for an invalid name).
func defaultChannel(ch, name string) string {
	if t, err := parseTable(name); ch == "" && err == nil {
		return t.flat
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

// checkChannel validates a NOTIFY channel name: 1 to 63 bytes, no NUL. It is
// always quoted with pgx.Identifier where it is spliced into SQL (LISTEN).
func checkChannel(ch string) error {
	if ch == "" || len(ch) > maxIdentLen || strings.ContainsRune(ch, 0) {
		return fmt.Errorf("channel %q: must be 1 to %d bytes without NUL: %w", ch, maxIdentLen, ErrInvalidConfig)
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
	idx := pgx.Identifier{t.flat + "_unsent"}.Sanitize()
	return "CREATE TABLE " + t.quoted + ` (
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
CREATE INDEX ` + idx + " ON " + t.quoted + " (id) WHERE sent_at IS NULL;\n"
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
	return "ALTER TABLE " + t.quoted + `
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
	return "ALTER TABLE " + t.quoted + " ADD COLUMN headers jsonb;\n"
}
