// Package redisq is a small job queue on Redis Streams (Redis 7.0 or later)
// built on go-redis v9: idempotent (bulk) add, push delivery to consumer
// groups, acknowledgement, reclaiming of stalled jobs, dead letters and
// trimming of acknowledged entries.
//
// A Publisher adds Jobs to a queue's stream; a Consumer reads them as one
// named member of a consumer group. Every group gets every job; the members
// of a group share them. Key names come from NewKeys; the Lua scripts (in
// the module's internal/queuescript directory) each start with a header stating
// KEYS, ARGV and return values.
//
// OutboxPublisher makes a Publisher the outbox.Publisher of an
// outbox.Relay, and InboxSource makes a Consumer the inbox.Source of an
// inbox.Consumer: the whole path from an outbox table to an inbox table.
//
// # Invariants
//
//   - Idempotent add. Add runs add.lua, one atomic call per
//     batch, which per job sets the job's dedupe mark (a member of the
//     queue's Keys.Dedupe sorted set, scored with its expiry, a Unix time
//     in ms) for DedupeTTL unless a live one is there, then XADDs. A job whose ID is still in the queue (not yet acknowledged by
//     every group and trimmed) and was added within DedupeTTL is not added
//     again and counts as success, so a caller that does not know whether
//     an Add went through simply repeats it. If the XADD fails the dedupe
//     mark is deleted again, so the retry is not swallowed. The marks of a
//     queue are one key, not a key per job, so that on a Redis Cluster an
//     add does not wait for a whole slot migration (see Keys). Once every group
//     has acknowledged a job, the trim deletes its dedupe mark with the
//     entry: a later re-add of that id is delivered again, and the
//     receiver's inbox (which already holds it) drops it. This is what
//     keeps Redis memory flat: remembering every id for DedupeTTL would grow
//     it with traffic (at 5,000 jobs/s, a day of ids is about 80 GB).
//   - Order. Add keeps slice order, also across a failure and its retry: a
//     failed Add added a prefix of its jobs and nothing after it (one
//     script call per batch; a pipeline of per-job calls could fail its
//     first calls, NOSCRIPT or LOADING, and add the later ones). A stream
//     hands entries out in the order they were added. Redeliveries (own
//     pending, reclaimed) come before new entries, so a redelivered job may
//     arrive after later ones: receivers that need order must tolerate that
//     (the chat orders by seq).
//   - At-least-once delivery. An entry stays in the group's pending list
//     from delivery until Ack or DeadLetter. A Consumer first hands out its
//     own pending entries (left by a previous run under the same name, or
//     handed out by an earlier Fetch and not settled), then stalled ones,
//     then new ones. The same entry can therefore be delivered more than
//     once; receivers deduplicate by Job.ID (the inbox).
//   - Stalled entries are reclaimed. An entry pending on any consumer for
//     longer than LockDuration is taken over by the next Consumer of the
//     group that scans for it (XAUTOCLAIM, at most every ClaimInterval).
//   - An entry leaves the stream only after every group acknowledged it:
//     the trim script computes, for each group, the lowest id it may still
//     need (its first pending id or the one after its last-delivered id) and
//     trims below the lowest of those. A group created later starts at what
//     is still in the stream.
//   - Fail fast, hold nothing. NewClient's client never retries and never
//     queues commands while disconnected; Add, Fetch and Ack keep nothing in
//     memory across calls except Fetch's read cursor.
//
// # Failure modes
//
//   - Redis down or unreachable: Add, Fetch, Ack and DeadLetter return an
//     error within about a second (dial timeout 500 ms, read timeout 1 s);
//     nothing is buffered. A failed Add may have added a prefix of its jobs:
//     the caller retries all of them.
//   - Redis restarted with appendonly yes (AOF): the stream, the group's
//     pending lists and the dedupe marks come back; nothing is lost (with
//     appendfsync everysec, at most the last second of writes can be lost
//     on a host crash; with always, nothing). The Lua script cache is empty
//     after a restart; Add reloads it (NOSCRIPT handling).
//   - Redis restarted without AOF: queued jobs and dedupe marks are lost; the
//     group is recreated by the next Fetch. CheckDurability warns loudly at
//     start when appendonly is not "yes" or maxmemory-policy is not
//     "noeviction" (eviction could drop the stream or dedupe marks).
//   - A consumer dies mid-batch: its entries stay pending; it finishes them
//     first when it restarts under the same name, or another consumer
//     reclaims them after LockDuration.
//   - Two live processes under one consumer name share its pending list:
//     each hands out the other's in-flight entries as its own. Keeping
//     names unique is the application's (the chat's package chat/presence
//     claims them in the queue's presence set, Keys.Presence);
//     DeleteIdleConsumers deletes the consumers it names gone, with
//     nothing pending, so unique names do not pile up in the group.
//   - Redis loses entries it had (FLUSHALL, XDEL or a trim by hand, a
//     failover to a replica that had not received them): NOGROUP on any
//     path makes the next Fetch create the group again from "0" (never
//     "$", so entries added meanwhile are delivered); a pending entry
//     found deleted (XAUTOCLAIM's third reply element, or a nil entry in
//     the own pending list) is acknowledged away, logged with its stream
//     id and counted (Consumer.DeletedPending, EventDeletedPending). The
//     job itself is gone from Redis: only the sender can bring it back,
//     with Readd, which gets past a dedupe mark that outlived its entry (the
//     chat's re-drive does that when no receipt came back in time).
//   - Sentinel failover: NewClient takes a redis+sentinel:// URL
//     (ParseSentinelURL) and follows the primary; jobs the old primary had
//     not replicated are lost as above, unless the Publisher waited for
//     them to be replicated (PublisherConfig.ReplicaAcks: an add a replica
//     has not acknowledged fails with ErrNotReplicated, for the caller to
//     retry). That holds on a Redis Cluster too, where a master frozen past
//     its failover answers the adds it had queued and then drops them.
//   - Redis Cluster: NewClient takes a redis+cluster:// URL
//     (ParseClusterURL). A queue's keys share the hash tag "{<queue>}", so
//     one slot, and every script declares every key it touches. While the
//     slot migrates, MOVED and ASK are followed and TRYAGAIN retried within
//     the call (go-redis's ClusterMaxRedirects, then TryAgainBudget);
//     nothing is kept across calls. CLUSTERDOWN fails the call at once
//     (ErrClusterDown). Readd adds a job once per call even when a command
//     is sent twice (a token of the call in Keys.DedupeTokens).
//   - A malformed entry (fields missing, e.g. written by hand) is returned
//     with Delivery.Err set, so the caller can DeadLetter it; it never
//     crashes the consumer, is never skipped silently and does not block the
//     entries behind it.
//
// # Memory
//
// A dedupe mark (about 145 bytes of Redis memory for a 36-character id, a
// sorted-set member: MEMORY USAGE of the set over 10,000 marks, Redis 7.0)
// lives while its entry is in the stream, at most DedupeTTL. Entries are trimmed, with
// their dedupe marks, once every group has acknowledged them (checked at most
// every TrimInterval, by Ack and by a Fetch that finds nothing new), so the
// stream holds only the backlog, not history, and memory returns to where it
// started once the queue drains.
// The dead-letter stream is capped at ConsumerConfig.DeadLetterMax entries
// (100,000 by default; the oldest are dropped, exactly, and counted by
// EventDeadLetterTrimmed).
//
// # Operating it
//
// Inspect reads a queue's length, each group's pending entries and lag and
// each consumer's idle time, and the dead letters; ReadDurability each node's durability settings. DeadLetters lists,
// shows, replays (back on the stream with the entry's signature, its
// dedupe mark set, the dead entry deleted, in one script) and drops dead
// letters; a repeated Replay or Drop changes nothing.
package redisq
