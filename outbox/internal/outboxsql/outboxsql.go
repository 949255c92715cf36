// Package outboxsql names an outbox table and holds the SQL that package
// outbox runs against one: the Writer's INSERTs, the relay's claim, delete
// and failure statements, and the operator's queries. (The DDL stays with
// outbox.TableDDL, whose documentation shows it.) Table
// names are validated here and spliced into the text only quoted; every
// other value is a bind parameter.
package outboxsql

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
)

// identRe matches one unquoted lower-case identifier part.
var identRe = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// MaxIdentLen is PostgreSQL's NAMEDATALEN-1 (63 bytes): longer names are
// truncated by the server, which would silently make two names equal.
const MaxIdentLen = 63

// Table is a validated outbox table name. Make it with ParseTable; the
// zero value names no table.
type Table struct {
	// Name is the name as given: "ident" or "schema.ident".
	Name string
	// Quoted is Name sanitized by pgx.Identifier, safe to splice into SQL.
	Quoted string
	// Flat is Name with '.' replaced by '_' (the default channel, and the
	// prefix of the index name).
	Flat string
}

// ParseTable validates name as ident or schema.ident, each part matching
// [a-z_][a-z0-9_]* and at most MaxIdentLen bytes long. The error names the
// table and the rule it breaks; the caller wraps its own sentinel.
func ParseTable(name string) (Table, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return Table{}, fmt.Errorf("table %q: want ident or schema.ident", name)
	}
	for _, p := range parts {
		if !identRe.MatchString(p) || len(p) > MaxIdentLen {
			return Table{}, fmt.Errorf("table %q: each part must match [a-z_][a-z0-9_]* and be at most %d bytes", name, MaxIdentLen)
		}
	}
	return Table{Name: name, Quoted: pgx.Identifier(parts).Sanitize(), Flat: strings.ReplaceAll(name, ".", "_")}, nil
}

// CheckChannel validates a NOTIFY channel name: 1 to MaxIdentLen bytes, no
// NUL. It is always quoted with pgx.Identifier where it is spliced into
// SQL (LISTEN). The error names the channel; the caller wraps its own
// sentinel.
func CheckChannel(ch string) error {
	if ch == "" || len(ch) > MaxIdentLen || strings.ContainsRune(ch, 0) {
		return fmt.Errorf("channel %q: must be 1 to %d bytes without NUL", ch, MaxIdentLen)
	}
	return nil
}
