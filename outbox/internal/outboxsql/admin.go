package outboxsql

// StatsSQL returns the query of outbox.ReadStats: the unsent rows not
// parked, the parked ones, and the age (s, float8) of the oldest unparked
// one (0 when none).
func (t Table) StatsSQL() string {
	return `SELECT count(*) FILTER (WHERE parked_at IS NULL),
  count(*) FILTER (WHERE parked_at IS NOT NULL),
  coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE parked_at IS NULL)), 0)::float8
FROM ` + t.Quoted + ` WHERE sent_at IS NULL`
}

// ParkedSQL returns the query of outbox.Parked ($1 limit, NULL: all): id,
// idempotency_key, event, payload, created_at, parked_at, attempts,
// failures and last_error (empty when NULL) of the parked rows, in id order.
func (t Table) ParkedSQL() string {
	return `SELECT id, idempotency_key, event, payload, created_at, parked_at, attempts, failures,
  coalesce(last_error, '') FROM ` + t.Quoted + ` WHERE sent_at IS NULL AND parked_at IS NOT NULL ORDER BY id LIMIT $1`
}

// RetrySQL returns the statement of outbox.Retry ($1 bigint[] of ids,
// NULL: every parked row): it deletes the parked rows and inserts them
// again as new rows (new ids, in old id order; failures, retry_at and
// parked_at cleared), and returns the old id, the new id and the
// idempotency key of each, in old id order. Run it after XactID in the
// same transaction.
func (t Table) RetrySQL() string {
	return `WITH old AS (
  DELETE FROM ` + t.Quoted + ` WHERE sent_at IS NULL AND parked_at IS NOT NULL AND ($1::bigint[] IS NULL OR id = ANY($1))
  RETURNING id, event, idempotency_key, payload, created_at, attempts, last_error
), ins AS (
  INSERT INTO ` + t.Quoted + ` (event, idempotency_key, payload, created_at, attempts, last_error)
  SELECT event, idempotency_key, payload, created_at, attempts, last_error FROM old ORDER BY id
  RETURNING id, idempotency_key
)
SELECT old.id, ins.id, ins.idempotency_key FROM old JOIN ins USING (idempotency_key) ORDER BY old.id`
}

// XactID gives the transaction its xid before the rows RetrySQL inserts
// take their ids (the claim floor's assumption, internal/claimfloor): the
// DELETE would too, but only once it finds a row.
const XactID = "SELECT pg_current_xact_id()"

// DeadRows ($1 a quoted table name) reads the table's dead rows from the
// statistics (flushed by backends about once a second).
const DeadRows = "SELECT coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = $1::regclass), 0)"

// Vacuum returns the VACUUM of the table; it cannot run in a transaction
// block, so send it without arguments (as a simple query).
func (t Table) Vacuum() string { return "VACUUM " + t.Quoted }
