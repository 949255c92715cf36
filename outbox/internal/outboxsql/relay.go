package outboxsql

// Relay is the statements a relay runs on one table, built once by
// Table.Relay. The parameters of each are given beside it.
type Relay struct {
	// Claim ($1 batch size, $2 the claim floor) selects and locks the next
	// unsent, unparked rows: id, idempotency_key, event, payload,
	// created_at, headers, and how long (s, float8) the row still waits
	// after a failure of its own (0: not waiting).
	Claim string
	// Mark ($1 bigint[] of ids) deletes published rows.
	Mark string
	// Record ($1 bigint[] of ids, $2 last_error) counts a failed pass on
	// the rows.
	Record string
	// Fail ($1 id, $2 last_error, $3 first backoff ms, $4 backoff cap ms,
	// $5 max attempts, ≤ 0: never park) counts a failure of the row's own
	// and returns its failures and whether it is now parked.
	Fail string
}

// Relay builds the relay's statements for t.
func (t Table) Relay() Relay {
	return Relay{
		// Plain FOR UPDATE, not SKIP LOCKED, ORDER BY id over the partial
		// index: the outbox package doc's order invariant (a second relay
		// waits, then skips the rows the first one deleted). "id >= $2":
		// the claim floor (internal/claimfloor). Parked rows (Fail) are not
		// claimed; the pass publishes only the rows before the first
		// waiting one.
		Claim: "SELECT id, idempotency_key, event, payload, created_at, headers, " +
			"coalesce(greatest(extract(epoch FROM retry_at - now()), 0), 0)::float8 FROM " + t.Quoted +
			" WHERE sent_at IS NULL AND parked_at IS NULL AND id >= $2 ORDER BY id LIMIT $1 FOR UPDATE",
		// Published rows are deleted, not updated (the package doc says
		// why). sent_at stays NULL; a table whose rows an older relay marked
		// sent keeps those (never claimed).
		Mark: "DELETE FROM " + t.Quoted + " WHERE id = ANY($1)",
		// Best effort, after the rollback: the claimed rows are unlocked
		// again, so this may wait for another relay (bounded by
		// lock_timeout).
		Record: "UPDATE " + t.Quoted +
			" SET attempts = attempts + 1, last_error = $2 WHERE id = ANY($1) AND sent_at IS NULL",
		// A row the Publisher blamed (MessageError), in the pass's own
		// transaction (the row is locked by the claim): the pause before
		// the next try doubles per failure. An UPDATE of one row per
		// failure, never per message published.
		Fail: "UPDATE " + t.Quoted + ` SET attempts = attempts + 1, failures = failures + 1, last_error = $2,
  retry_at = now() + least($3::float8 * power(2, least(failures, 30)), $4::float8) * interval '1 millisecond',
  parked_at = CASE WHEN $5::int > 0 AND failures + 1 >= $5::int THEN now() END
WHERE id = $1 RETURNING failures, parked_at IS NOT NULL`,
	}
}

// Statements of a pass that name no table. Snapshot reads xmin of the
// statement's snapshot; Xid the xid of a pass that claimed rows (its row
// locks assigned it; internal/claimfloor). xid8 fits bigint for 2^63
// transactions.
const (
	// Seq ($1 a quoted table name) reads the last value of the table's
	// identity sequence (0 before the first row).
	Seq = "SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence($1, 'id')::regclass), 0)"
	// Seqs is Seq for the tables $1 (text[] of quoted names) in one
	// statement: their values in the order of $1.
	Seqs = "SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence(t, 'id')::regclass), 0) " +
		"FROM unnest($1::text[]) WITH ORDINALITY AS u(t, n) ORDER BY n"
	Snapshot = "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint"
	Xid      = "SELECT pg_current_xact_id()::text::bigint"
)

// SetTimeouts ($1 lock_timeout, $2 statement_timeout, $3
// idle_in_transaction_session_timeout, as PostgreSQL durations) applies the
// relay's bounds to the current transaction only.
//
// It also steers the planner, for this transaction only, to index scans. The
// outbox is a queue table: every pass leaves dead entries in the partial
// index (the old, unsent row versions) until vacuum, and between ANALYZE runs
// the statistics badly underestimate them. The planner then picks a bitmap
// scan plus sort for the claim, which visits every dead entry on every pass,
// and a sequential scan for "id = ANY($1)"; both make a pass O(table) until
// autovacuum catches up. An ordered index scan on the partial index stops
// after BatchSize live rows and lets btree mark dead entries so later scans
// skip them; the primary-key lookup is O(BatchSize). Every relay statement is
// an index lookup, so nothing else is affected.
//
// Last, the relay's commit does not wait for its WAL flush
// (synchronous_commit=off, this transaction only), one fsync less per
// message: a deletion lost to a database crash only makes the next pass
// publish those rows again (the package doc's at-least-once invariant).
const SetTimeouts = "SELECT set_config('lock_timeout', $1, true), " +
	"set_config('statement_timeout', $2, true), " +
	"set_config('idle_in_transaction_session_timeout', $3, true), " +
	"set_config('enable_seqscan', 'off', true), " +
	"set_config('enable_bitmapscan', 'off', true), " +
	"set_config('synchronous_commit', 'off', true)"
