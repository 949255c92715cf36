package redisq

// Every Redis key the package touches is built here, so the layout is in one
// place. All keys of one queue share the hash tag "{<queue>}", so they live in
// one Redis Cluster slot and the Lua scripts may touch them together.
//
//	stream:      <prefix>q:{<queue>}:stream
//	dedupe key:  <prefix>q:{<queue>}:dedupe:<job id>
//	dead letter: <prefix>q:{<queue>}:dead
//	presence:    <prefix>q:{<queue>}:consumers   (sorted set, presence.lua)

// Keys holds the key names of one queue. The zero value is not useful; build
// it with NewKeys. Keys is a plain value, safe to copy and share.
type Keys struct {
	// Stream is the Redis stream holding the queue's entries.
	Stream string
	// Dead is the dead-letter stream (entries moved out by DeadLetter).
	Dead string
	// Presence is the sorted set of live consumer processes (Presence):
	// member "<group>\x00<name>\x00<instance>", score its expiry (Unix ms).
	Presence string
	// dedupe is the prefix of the per-job dedupe keys; see Dedupe.
	dedupe string
}

// NewKeys returns the key names for queue under prefix (prefix may be "";
// it is prepended verbatim, so include a separator such as "app:" yourself).
func NewKeys(prefix, queue string) Keys {
	base := prefix + "q:{" + queue + "}:"
	return Keys{
		Stream:   base + "stream",
		Dead:     base + "dead",
		Presence: base + "consumers",
		dedupe:   base + "dedupe:",
	}
}

// Dedupe returns the dedupe key of job id: a string key set with SET NX PX
// by the add script, living for the publisher's DedupeTTL.
func (k Keys) Dedupe(id string) string { return k.dedupe + id }
