// Package store is the send path of one service: Store.SendIdempotent
// writes a message and its message.created outbox event in one transaction
// (the transactional outbox: both commit or neither does), and
// Store.History reads a chat back.
//
// Invariant: a chat's messages of one service carry seq 1, 2, 3 … without
// gaps, in commit order, and a seq is never handed out twice, whatever
// deletes rows (retention, prune.Run, an operator's DELETE). A send takes the
// chat's transaction advisory lock (schema.ChatLockSQL), reads the chat's
// last seq (backward index steps: its newest row, and the newest seq floor
// that a DELETE, or a receipt above its rows, recorded) and inserts at the
// next; no row is updated. Concurrent sends are
// group-committed (batch.go): one committer takes every queued send into
// one transaction; a chat whose lock another session holds waits in a slow
// lane, at most the lock timeout, without holding back the other chats.
// Nothing is stored for rejected input, and a send that fails stores
// nothing.
//
// Package chat/store/prune deletes history older than a cutoff and keeps
// what a chat's seq, watermark and receipts need.
//
// DualWriter is the write-up's naive v1 (commit, then add to Redis from
// memory), kept for the lab to show what the outbox fixes.
package store
