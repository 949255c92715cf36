// Package chaos is the write-up's fault experiment on real processes (Run):
// consumers sends ten messages to chat 1, one every 400 ms, while workers
// is redeployed, Redis goes down and consumers is redeployed; in v2 workers
// also crashes right after recording message 2, before acknowledging it.
// v1 (the naive dual write) loses messages 7 and 8; v2 (the transactional
// outbox) loses none and skips exactly one duplicate (Expected).
//
// The figures come from the database and a WebSocket client (lab/probe),
// never from the experiment's own bookkeeping of what it sent.
package chaos
