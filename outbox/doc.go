// Package outbox implements the transactional outbox on PostgreSQL (pgx v5):
// a Writer that enqueues events inside the caller's transaction, and a Relay
// that moves committed events to a broker through a Publisher.
//
// # Table
//
// The outbox table is created by the application's migrations from TableDDL
// (its columns are listed there; ParkingDDL adds the poison-handling ones
// to an older table). It holds only unsent rows: a row is deleted once
// published. The identity sequence must keep its default CACHE 1 and ids
// must not be given explicitly (the claim floor, below, relies on both),
// and the relay's role needs USAGE or SELECT on that sequence (its owner
// has both) besides SELECT and DELETE on the table.
//
// # Writer
//
// Writer.Enqueue inserts events with one statement in the caller's pgx.Tx
// and never commits. The relay is woken per WakeMode: WakeAfterCommit
// (default: the caller calls Writer.Committed after commit, and one
// coalesced pg_notify follows per burst), WakeInTx (pg_notify inside the
// transaction; it serialises notifying commits) or WakeNone (poll only).
// Writers of several tables can share a Notifier (WriterConfig.Notifier):
// one statement then wakes all of their channels.
//
// # Relay
//
// A pass (Relay.RunOnce) is one transaction: BEGIN; set transaction-local
// lock_timeout, statement_timeout and idle_in_transaction_session_timeout;
// claim up to BatchSize unsent rows with id ≥ the claim floor ORDER BY id
// FOR UPDATE; Publish; DELETE them; COMMIT, in two round trips besides
// Publish. Deleting rather than updating the
// published rows, and starting the claim at the floor (an id below which
// every row is known published, see internal/claimfloor), keep a pass's cost
// independent of how many rows were published since vacuum last ran: while
// an old snapshot holds the xmin horizon back, nothing can be vacuumed, and
// an update per message (a row version and an index entry each) or a claim
// from the start of the index would make every pass slower than the last.
//
// The running relay (Relay.Start) LISTENs (on its own connection or a
// shared RelayConfig.Notifier) and runs passes on each notification (but
// those RelayConfig.IgnoreNotification drops), on Relay.Wake, and every
// PollInterval without one, until a pass comes back less than full.
//
// Relays of several tables in one process (one table per partition, say)
// can share their passes (RelayConfig.Group, a RelayGroup): the passes that
// start while one is in flight run together in the next one, one
// transaction that claims from each table, publishes each table's rows to
// its own Publisher and deletes them. Each table keeps its claim, its
// floor and its order; a failed Publish fails its own member's pass only.
//
// # Invariants
//
//   - Atomic write: an event is committed with the caller's data or not at
//     all; enqueueing touches only PostgreSQL, so it works while the broker
//     is down.
//   - The relay holds nothing in memory between passes but the claim
//     floor, a hint (a fresh relay starts with a full scan, and one runs
//     every 10 s anyway): a pass either deletes every row it published, or
//     rolls back and leaves them all unsent for the next pass. Failed
//     passes increment attempts and set last_error on the claimed rows
//     (best effort, after the rollback).
//   - At-least-once publication, idempotent by Message.ID: a relay that
//     crashes (or loses its connection) between Publish and COMMIT leaves the
//     rows unsent and they are published again; the Publisher must treat a
//     repeated ID as a successful no-op.
//   - Order: rows are claimed and published in id order. For rows whose
//     enqueuing transactions lock a common row (the chat's per-chat counter)
//     id order equals commit order, so a chat's events are published in
//     sequence. Claims use plain FOR UPDATE, not SKIP LOCKED: a second relay
//     (rolling deploy) waits for the first one's pass (at most LockTimeout,
//     then it fails and retries) instead of publishing later rows in
//     parallel; each ID is published by one of them (or by both, after a
//     failure).
//   - Every step is bounded: PublishTimeout on Publish, and lock_timeout,
//     statement_timeout and idle_in_transaction_session_timeout on every
//     relay transaction; the LISTEN connection's connect and health checks
//     have fixed bounds.
//
// # Failure modes
//
//   - Broker down: Publish fails fast (the Publisher must not queue offline),
//     the pass rolls back, the relay backs off (50 ms doubling to 1 s) and
//     retries; rows wait in the table.
//   - PostgreSQL down or a relay session killed: the pass fails and rolls
//     back (or its commit's outcome is unknown: then the rows are published
//     again, idempotently).
//   - LISTEN connection lost: passes still run every PollInterval; the relay
//     reconnects at once, then with capped backoff while connects fail (50
//     ms doubling to 1 s, at most PollInterval), and runs a catch-up pass
//     after each reconnect, since notifications sent meanwhile are gone.
//     RelayEvent.Trigger tells which passes were woken and which polled.
//   - Lost wake-up (WakeAfterCommit process crash after commit, failed
//     notify): caught by the next poll.
//   - A row that can never be published (poison): the Publisher blames it
//     with a MessageError (redisq's adapter does for an empty id or an
//     "ERR" reply to its job). The rows before it are published; it gets
//     failures+1, last_error and a backoff (RetryBackoff, 50 ms doubling to
//     RetryBackoffMax, 1 s) during which passes publish nothing behind it,
//     so order holds; at MaxAttempts (10) failures it is parked (parked_at,
//     EventParked, an Error log line naming row_id and message_id): no
//     longer claimed, it stops holding back the rows behind it, which then
//     overtake it (the chat's receivers see a gap, see below). Failures of a
//     whole pass (broker down, timeouts) never count toward parking.
//
// # Operating it
//
// ReadStats (unsent rows, the oldest one's age on the database clock,
// parked rows) is one statement, for dashboards and probes. Parked lists
// parked rows and Retry enqueues them again under new ids. The order policy for a parked row: it is
// published after the rows that overtook it, so a receiver that applies a
// chat in seq order meets a gap while it is parked (the chat's gateway
// holds the rows behind the gap for its gap timeout, then shows them) and
// the parked row late once retried.
//
// The space of the deleted rows returns only with VACUUM: Vacuum, a small
// service for the relay's process, vacuums the table often enough that
// under a steady load it stays near its starting size. There is no
// retention setting: nothing is kept once published (history belongs in
// the application's own tables).
package outbox
