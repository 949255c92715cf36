// Package inbox is the receiving side of the transactional outbox: a
// Consumer that takes deliveries from a queue (a Source), records each one in
// an inbox table through a Handler inside one Postgres transaction per batch,
// commits, and only then acknowledges the deliveries to the queue.
//
// # Invariants
//
//   - Exactly-once effect. The queue delivers at least once. The Handler
//     inserts an inbox row keyed by the delivery's idempotency key
//     (INSERT ... ON CONFLICT DO NOTHING) and applies its effects in the same
//     transaction, only when the row is new. A delivery therefore has its
//     effect once, however often it arrives.
//   - Ack only after commit. Deliveries are acknowledged (Source.Ack) only
//     after the transaction that recorded them has committed durably. The
//     Consumer refuses synchronous_commit=off: every transaction it opens
//     raises synchronous_commit from off to on (SET LOCAL), whatever the
//     pool, role or server default says. With synchronous_commit=off the
//     commit returns before its WAL is flushed; a Postgres crash right after
//     the ack would then lose an inbox row whose job is already gone from the
//     queue: the message is lost for good. Other values
//     (local, remote_write, on, remote_apply) are left alone.
//   - Duplicates are counted and skipped. A delivery whose inbox row already
//     exists (fresh=false) changes nothing, is acknowledged, counted in
//     Stats.Duplicates and logged at Info as "duplicate skipped" with key
//     message_id (a stable line: the chat's lab counts it).
//   - Malformed input never blocks the queue. A delivery the Source could
//     not read (Delivery.Err set), one the Handler rejects with
//     ErrMalformed, or one that fails in SQL with a permanent error
//     (SQLSTATE class 22 data exception or 23 integrity constraint
//     violation), is dead-lettered with the error text as the reason (after
//     the commit of the batch that carried it); the other deliveries are
//     applied.
//   - Order of application is delivery order. Deliveries are applied one at
//     a time, in the order Fetch returned them, by one goroutine. A batch
//     that failed transiently is retried as a whole, before anything newer
//     is fetched, so a later message of a chat is never applied before an
//     earlier one that is merely delayed.
//
// Consumers of several queues in one process (one per partition, say) can
// share their inbox transactions (Config.Group, a Group): batches that
// arrive while another member's transaction is in flight commit together in
// the next one. Every invariant above holds per member: each applies its
// own deliveries in its own order, and acknowledges them after the shared
// commit; a shared transaction that fails is run again one member batch
// per transaction, so that a poison delivery is isolated in its own batch.
//
// # Failure modes
//
//   - Crash before commit: the transaction rolls back; the deliveries were
//     not acknowledged and are delivered again (the same consumer name reads
//     its pending entries first; another consumer reclaims them after the
//     queue's lock duration). They are applied once.
//   - Crash after commit, before ack: the deliveries come back and the
//     inbox rows exist: they are skipped and counted as duplicates.
//   - Postgres down, or any error that is not permanent (connection
//     refused, timeouts, serialization failures, deadlocks): the batch is
//     rolled back and not acknowledged; the Consumer backs off
//     (Config.RetryBackoff, doubling up to Config.MaxRetryBackoff) and
//     retries the same batch until it succeeds or the Consumer stops.
//   - Redis down: Fetch, Ack or DeadLetter fail. A failed Fetch is retried
//     with backoff. A failed Ack or DeadLetter after a commit is logged and
//     not retried: the entries stay pending, come back later, and are
//     skipped as duplicates (or dead-lettered again).
//   - Poison input: a delivery with a permanent SQL error aborts its batch;
//     the batch is then re-run one delivery per transaction to isolate it,
//     the poison is dead-lettered and the rest are applied.
//   - A Handler that breaks its contract (touches the transaction and then
//     returns ErrMalformed, leaving the transaction aborted) makes the next
//     statement fail with SQLSTATE 25P02, which is treated as transient: the
//     batch is retried forever. Decode before touching the transaction.
package inbox
