package chat

import "errors"

// Errors of the send path and the history, shared by the store that returns
// them and the API that maps them to statuses.

// ErrChatBusy is returned (wrapped) by a send when the chat's lock was not
// free within the lock timeout (another session holds it). Nothing of the
// send is stored; it may be retried.
var ErrChatBusy = errors.New("chat busy: its lock was not free within the lock timeout")

// ErrSendTimeout is returned (wrapped) by a send when the send transaction
// ran into statement_timeout or sendBatchTimeout. Unless the error came
// from the COMMIT itself nothing is stored; retry with the same key to be
// sure.
var ErrSendTimeout = errors.New("send timed out")

// ErrSendOutcomeUnknown is returned (wrapped) by a send whose transaction's
// connection failed after its COMMIT was sent, when the store could not
// then read whether the transaction committed (the database unreachable,
// the chat's lock not free within the lock timeout). The message may be
// stored: retry with the same idempotency key, which stores it at most
// once. A send without a key cannot be told apart from a new one.
var ErrSendOutcomeUnknown = errors.New("send outcome unknown: the message may be stored")

// ErrIdempotencyConflict is returned (wrapped) by a send when the send's key
// was already used in the chat for a message with another body.
var ErrIdempotencyConflict = errors.New("idempotency key already used for another message in this chat")

// ErrReadTimeout is wrapped by a history read when the read did not finish within
// the read timeout.
var ErrReadTimeout = errors.New("read timed out")

// History is one page of a chat as this service sees it.
//
// Sent holds this service's own messages with seq > the sent cursor,
// Received the other service's with seq > the received cursor, each in seq
// order and at most limit long. More is true when either list was cut at
// limit: ask again with the last seqs as cursors.
type History struct {
	Sent, Received []Message
	More           bool
}
