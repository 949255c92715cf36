package redisq

// Every Redis key the package touches is built here, so the layout is in one
// place. All keys of one queue share the hash tag "{<queue>}", so they live in
// one Redis Cluster slot and the Lua scripts may touch them together.
//
//	stream:        <prefix>q:{<queue>}:stream
//	dedupe marks:  <prefix>q:{<queue>}:dedupe         (sorted set, add.lua)
//	re-add tokens: <prefix>q:{<queue>}:dedupe-tokens  (hash, add.lua)
//	dead letter:   <prefix>q:{<queue>}:dead
//	presence:      <prefix>q:{<queue>}:consumers      (sorted set, the application's)
//
// The dedupe marks of all jobs live in one key per queue, not one key per
// job: a key per job is a new key on every add, and during a Redis Cluster
// slot migration a script whose keys are not all on one node gets TRYAGAIN
// (a new key is never on the source node), so every add waited for the
// whole migration of the slot. Once the queue has had an add, the per-queue
// keys exist before a migration starts (each holds a placeholder member, the
// empty id, that never expires), so an add waits at most while they and the
// stream are on two nodes. (A queue whose stream a consumer created and that
// has had no add yet still waits for the whole move.) Their names have no
// ":" after "dedupe", so no job id makes an earlier version's per-job key
// (<prefix>q:{<queue>}:dedupe:<job id>) equal to one of them.

// Keys holds the key names of one queue. The zero value is not useful; build
// it with NewKeys. Keys is a plain value, safe to copy and share.
type Keys struct {
	// Stream is the Redis stream holding the queue's entries.
	Stream string
	// Dead is the dead-letter stream (entries moved out by DeadLetter).
	Dead string
	// Presence is the sorted set of the queue's live consumer processes:
	// member "<group>\x00<name>\x00<instance>", score its expiry (Unix ms).
	// This package never reads or writes it; it names it, in the queue's
	// hash tag, and ACLRules grants it, for the application that keeps it
	// (the chat's is package chat/presence).
	Presence string
	// Dedupe is the sorted set of the queue's dedupe marks: member a job
	// id, score the Unix time in ms after which its mark no longer counts
	// (the trim deletes expired marks); member "" has score +inf.
	Dedupe string
	// DedupeTokens is the hash of re-add tokens: field a job id, value the
	// token of the Readd call that last added it (see Publisher.Readd);
	// field "" (value "") is a placeholder.
	DedupeTokens string
	// dedupeAll matches both keys above and the per-job keys of earlier
	// versions (<prefix>q:{<queue>}:dedupe:<job id>): ACLRules.
	dedupeAll string
}

// NewKeys returns the key names for queue under prefix (prefix may be "";
// it is prepended verbatim, so include a separator such as "app:" yourself).
func NewKeys(prefix, queue string) Keys {
	base := prefix + "q:{" + queue + "}:"
	return Keys{
		Stream:       base + "stream",
		Dead:         base + "dead",
		Presence:     base + "consumers",
		Dedupe:       base + "dedupe",
		DedupeTokens: base + "dedupe-tokens",
		dedupeAll:    base + "dedupe*",
	}
}
