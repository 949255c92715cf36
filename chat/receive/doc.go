// Package receive is the receiving side of one service and the receipts
// that travel back: InboxHandler stores each message of the peer once in
// the service's inbox (the inbox.Handler of package inbox, whose
// transaction also records duplicates), enqueues one cumulative receipt
// per batch in the service's own outbox, and applies the peer's receipts to
// the service's receipts table; Waker tells the service's other processes'
// gateways about those commits after they are made (the inbox transaction
// itself runs no NOTIFY); Redriver publishes again the messages no receipt
// came back for in time.
//
// Invariants: no receipt claims a seq the receiver never stored (a receipt
// covers a chat only up to its highest inbox row not stored behind a gap,
// or the floor a DELETE of its rows recorded, so deleted rows neither hold
// a chat back nor let a seq in twice; a seq already stored under another
// message id is dead-lettered as ErrSeqConflict, never stored); every
// message gets a receipt in the end (cumulative receipts, and the re-drive
// for what Redis lost); a received message is never shown twice (the
// inbox's primary key). Failure modes: a lost or repeated receipt is
// harmless, the next one covers it; a message lost in Redis (failover,
// FLUSHALL, XDEL) comes back by the re-drive, and its duplicates are
// dropped by the inbox.
package receive
