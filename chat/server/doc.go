// Package server runs one outboxchat service process: Serve builds, from a
// Config grouped by role, the services of the roles it runs and runs them
// until its context ends, then stops them in reverse.
//
//   - api: the HTTP API, WebSocket gateway and chat page (packages httpapi,
//     gateway) over the send path (package store);
//   - relay: outbox.Relay publishing the service's outbox to the queue
//     chat.QueueName(service), its vacuum and heartbeat, and the re-drive
//     (package receive);
//   - worker: inbox.Consumer reading the peer's queue in consumer group
//     "<service>" into the inbox (package receive).
//
// Every Prometheus metric of a process is defined in package
// chat/server/internal/metrics. Failure modes: Redis down — sends still
// succeed, the outbox fills, the relay retries; a relay crash between
// publish and commit — the batch is published again and the receiver's inbox
// drops it; a worker crash before its commit — the job stays pending and is
// handed out again (first to the same consumer name, else after the lock
// duration); after the commit and before the ack — it comes back and is
// counted as a duplicate; Postgres down — sends answer 503 and write
// nothing, the relay and worker back off and resume. The lab injects its
// crashes through Config.Hooks; this package has no fault code.
package server
