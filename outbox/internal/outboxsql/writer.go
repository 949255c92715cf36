package outboxsql

import "encoding/json"

// Writer is the INSERTs a Writer runs on one table, built once by
// Table.Writer. Both make sure the transaction has its xid before the row
// takes its id from the identity sequence (the subquery on
// pg_current_xact_id is evaluated before any row is produced): the relay's
// claim floor (internal/claimfloor) relies on it.
type Writer struct {
	// InsertOne ($1 event, $2 idempotency key, $3 payload as JSON text,
	// $4 headers as JSON text or NULL) inserts one row.
	InsertOne string
	// InsertMany is InsertOne for text[] arrays of the four, one row per
	// element, taking ids in the order of the arrays (WITH ORDINALITY +
	// ORDER BY), so the relay publishes a multi-event enqueue in the order
	// given.
	InsertMany string
}

// Writer builds the Writer's statements for t.
func (t Table) Writer() Writer {
	return Writer{
		InsertOne: "INSERT INTO " + t.Quoted + ` (event, idempotency_key, payload, headers)
SELECT $1, $2, $3::text::jsonb, $4::text::jsonb FROM (SELECT pg_current_xact_id() OFFSET 0) AS x`,
		InsertMany: "INSERT INTO " + t.Quoted + ` (event, idempotency_key, payload, headers)
SELECT e, k, p::jsonb, h::jsonb FROM (SELECT pg_current_xact_id() OFFSET 0) AS x,
  unnest($1::text[], $2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS u(e, k, p, h, n) ORDER BY n`,
	}
}

// Headers returns h as the headers parameter of InsertOne and InsertMany:
// a JSON object, or nil (SQL NULL) when h is empty, so a row without
// headers costs nothing more than one from before the column.
func Headers(h map[string]string) *string {
	if len(h) == 0 {
		return nil
	}
	b, err := json.Marshal(h) // cannot fail for a map of strings
	if err != nil {
		return nil
	}
	s := string(b)
	return &s
}

// Wake-up statements.
const (
	// Notify ($1 channel) wakes listeners on a channel; pg_notify (not
	// NOTIFY) because the channel is a bind parameter.
	Notify = "SELECT pg_notify($1, '')"
	// AfterCommitNotify is Notify for the post-commit wake-up, a
	// transaction of its own: its commit does not wait for the WAL flush
	// (synchronous_commit=off for it alone). A wake-up lost to a crash only
	// delays the relay until its poll, and the cluster-wide notify lock,
	// which a notifying commit holds until it ends, is then not held
	// through an fsync, so notifying commits do not queue behind each
	// other's flushes.
	AfterCommitNotify = "SELECT pg_notify($1, ''), set_config('synchronous_commit', 'off', true)"
	// NotifyMany is AfterCommitNotify for the channels $1 (text[]) in one
	// statement.
	NotifyMany = "SELECT set_config('synchronous_commit', 'off', true), count(pg_notify(c, '')) " +
		"FROM unnest($1::text[]) AS c"
)
