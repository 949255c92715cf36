package outbox

import (
	"context"
	"fmt"
	"time"
)

// Message is one outbox row as handed to a Publisher.
//
// ID is the idempotency key (for the chat: the message UUID as a string);
// a Publisher must treat a second publish of the same ID as a successful
// no-op. Event is the event name (for the chat: "message.created"). Payload
// is the JSON document stored in the row, in jsonb's normalized text form
// (key order and whitespace may differ from what was enqueued).
type Message struct {
	// RowID is the outbox row's identity value (bigint), taken when the row
	// was inserted. It increases in insert order, not commit order: a
	// transaction that inserted first may commit after one that inserted
	// later (and the relay then publishes the later-committed row after
	// it). Transactions that lock a common row before they insert (the
	// chat's per-chat counter) commit in RowID order; see the package doc.
	RowID int64
	// ID is the idempotency key, taken from Event.ID at enqueue time.
	ID string
	// Event is the event name.
	Event string
	// Payload is the JSON payload as stored (jsonb text form).
	Payload []byte
	// CreatedAt is when the row was inserted (database clock).
	CreatedAt time.Time
	// Headers are the event's headers (Event.Headers) as stored; nil when
	// it had none. A Publisher should carry them to the receiver (redisq's
	// OutboxPublisher does) and may replace the map (not modify it: the
	// relay may hand the same message to a retried Publish).
	Headers map[string]string
}

// Publisher moves a batch of outbox messages to the broker.
//
// Publish must be idempotent per Message.ID (at-least-once relay: a batch
// whose mark-sent commit failed is published again) and must either return
// nil after every message is durably accepted by the broker, or an error. It
// must not buffer messages in memory for a later retry: on error the relay
// rolls back and the rows stay unsent. Publish must honour ctx's deadline.
// Messages are passed in outbox order; a Publisher must keep that order.
type Publisher interface {
	Publish(ctx context.Context, msgs []Message) error
}

// PublisherFunc adapts a function to Publisher.
type PublisherFunc func(ctx context.Context, msgs []Message) error

// Publish calls f(ctx, msgs).
func (f PublisherFunc) Publish(ctx context.Context, msgs []Message) error { return f(ctx, msgs) }

var _ Publisher = PublisherFunc(nil)

// MessageError is returned by a Publisher (possibly wrapped) when one
// message of the batch cannot be published through its own fault (the
// broker refuses it, it cannot be encoded or signed), while the broker
// itself works. Every message before it in the batch must have been
// published. The relay then deletes those, counts a failure on the row
// RowID (attempts, last_error, a backoff during which it holds back the
// rows behind it) and parks it after RelayConfig.MaxAttempts such
// failures. Return a plain error instead when the failure is not the
// message's (broker down, timeout): those never park a row.
type MessageError struct {
	// RowID is Message.RowID of the message at fault.
	RowID int64
	// Err is why it failed; it becomes the row's last_error.
	Err error
}

func (e *MessageError) Error() string {
	return fmt.Sprintf("outbox: publishing row %d: %v", e.RowID, e.Err)
}

// Unwrap returns Err.
func (e *MessageError) Unwrap() error { return e.Err }
