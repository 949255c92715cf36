// Package chat is the outboxchat application: two services, consumers and
// workers, that chat through the transactional outbox (package outbox), a
// Redis Streams queue (package redisq) and an inbox (package inbox).
//
// Each service owns the Postgres schema and role named after it (Bootstrap,
// Migrate) with the tables messages, outbox, inbox and inbox_duplicates.
// Serve runs a service's roles:
//
//   - api: HTTP API, WebSocket gateway and the chat page (API, Gateway). A
//     send (Store.SendIdempotent) takes the chat's advisory lock, numbers
//     from the chat's last seq, and commits the message (with its optional
//     idempotency key) and its outbox event; no row is updated (batch.go).
//     Nothing is stored for rejected input; a database that cannot be
//     reached, or a chat whose lock stays busy past the lock timeout,
//     answers 503.
//   - relay: outbox.Relay publishing the service's outbox to the queue
//     "<service>-to-<peer>" (QueueName) with the message id as job id; and
//     the Redriver, which publishes again the messages no receipt came back
//     for within Config.RedriveAfter (redrive.go); the relay parks a row
//     whose publish failed Config.RelayMaxAttempts times by its own fault,
//     outbox.Vacuum keeps the outbox small, and a heartbeat row says when
//     the relay last passed (heartbeat.go).
//   - worker: inbox.Consumer reading "<peer>-to-<service>" in consumer group
//     "<service>"; InboxHandler records each message once in the inbox and
//     NOTIFYs the gateway channel in the same transaction, enqueues one
//     cumulative receipt per batch (an entry per chat) in the service's own
//     outbox, and records the peer's receipts in <service>.receipts, from
//     which a message's delivered_at is derived (receipt.go; migration 007).
//
// ReadStatus (status.go) is the operator's snapshot of both services
// (`outboxchat status`); each process exports its part of it as gauges,
// read at most every 5 s.
//
// Invariants (DESIGN.md): a message and its event commit together; only the
// relay writes to Redis and it holds nothing in memory; publish is
// idempotent by message id; the inbox gives exactly-once effect and a job is
// acked only after its inbox commit; each side's messages of a chat carry
// seq 1, 2, 3 … in commit order and every subscriber sees them in that
// order, each once (the gateway holds received messages behind a missing
// seq for up to GatewayConfig.GapTimeout); the gateway learns of new rows
// from Postgres (NOTIFY, poll, catch-up by seq) or, in its own process,
// from a handover after the commit (Gateway.Offer), so a crash between an
// inbox commit and a push loses nothing.
//
// Failure modes: Redis down — sends still succeed, the outbox fills, the
// relay retries; Redis losing jobs the relay had published (failover,
// FLUSHALL, XDEL) — no receipt comes back, the Redriver publishes them
// again; a relay crash between publish and commit — the batch is
// published again and skipped by the receiver's inbox; a worker crash
// before its commit — the job stays pending and is handed out again (first
// to the same consumer name, else after the lock duration); after the
// commit and before the ack — it comes back and is counted in
// inbox_duplicates; Postgres down — sends answer 503 and write nothing, the
// relay and worker back off and resume.
//
// ModeDualWrite (v1) exists for the lab only. The lab injects its crashes
// through Config.Hooks (package internal/labfault, `serve --fault`); this
// package has no fault code.
package chat
