// Package status reads the operator's snapshot of both services (ReadStatus,
// `outboxchat status`): each outbox's backlog and parked rows, each relay's
// last pass, each stream's pending entries, lag, consumers and dead
// letters, and the database's cleanup horizon, judged against thresholds
// into a list of problems.
package status
