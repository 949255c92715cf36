package redisq

// Job is one queue entry.
//
// ID is the idempotency key: adding a Job whose ID is still in the stream
// (at most the dedupe TTL, until every consumer group has acknowledged it
// and a trim removed it) is a successful no-op. Name is the event name (e.g.
// "message.created"). Payload is opaque bytes (JSON for the chat).
type Job struct {
	ID      string
	Name    string
	Payload []byte
	// Sig is an optional signature of the job, opaque to the queue: when
	// not empty it is stored as the entry's "sig" field and read back into
	// Delivery.Sig. The queue never checks it; the receiver does (the chat
	// signs ID, Name and Payload with HMAC-SHA256, see
	// PublisherConfig.Sign).
	Sig string
	// Headers is the job's optional metadata (outbox.Event.Headers: a trace
	// context, a tenant, …), within the limits of outbox.CheckHeaders. When
	// not empty it is stored as the entry's "headers" field (a JSON object
	// of strings) and read back into Delivery.Headers. Default nil: no
	// field, as in entries written before headers existed.
	Headers map[string]string
}

// Delivery is a Job handed to a consumer-group member.
//
// StreamID is the Redis stream entry id ("1700000000000-0"), used to ack.
// Deliveries is how many times Redis has handed this entry out (1 on the
// first delivery; from XPENDING/XAUTOCLAIM bookkeeping where known, else 1).
type Delivery struct {
	Job
	StreamID   string
	Deliveries int64
	// Err is nil for a well-formed entry. For an entry lacking the id, name
	// or payload field, or whose headers field is not a JSON object of
	// strings within the limits (not written by Publisher.Add), it wraps
	// ErrMalformedEntry, and Job holds whatever fields could be read: the
	// caller should DeadLetter it.
	Err error
}
