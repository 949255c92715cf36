// Package probe is what the lab's experiments observe a running
// environment (lab/env) with, from outside the services: WebSocket clients
// that record every frame and reconnect with their cursors (Watcher),
// senders through the HTTP API (Sender, and ConnSender for load), a tap on
// the queue streams through a consumer group of its own (Tap), the event
// log in the write-up's format (EventLog), the figures read from the
// database and a watcher (Figures, ReadFigures, Settled) and the small
// statistics and tables the reports print (Percentile, Median,
// WriteColumns, …).
//
// Reported figures come from the database and the watchers, never from an
// experiment's own bookkeeping of what it sent.
package probe
