package inbox

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Delivery is one job received from the queue, before decoding.
//
// Ref is the broker's handle used to acknowledge it (for redisq: the stream
// entry id). ID is the idempotency key the sender chose (the message id).
// Name is the event name the sender gave the job (e.g. "message.created").
// Payload is the raw job body. Err is nil unless the Source could not read
// the entry completely (e.g. a stream entry lacking fields): the Consumer
// then dead-letters it with reason Err.Error() without calling the Handler.
type Delivery struct {
	Ref     string
	ID      string
	Name    string
	Payload []byte
	// Sig is the entry's signature, when the queue carries one ("" = none);
	// the Handler checks it (the inbox does not).
	Sig string
	// Headers are the event's headers (outbox.Event.Headers, carried by the
	// queue: redisq's Job.Headers); nil when it had none. The Handler may
	// read them (a trace context, a tenant) and must not modify the map.
	Headers map[string]string
	Err     error
}

// Source is the queue side the Consumer reads from. Implementations must be
// safe for use by one Consumer goroutine at a time.
//
// Fetch blocks until at least one delivery is available, ctx is done, or an
// internal block timeout elapses (then it returns an empty slice and nil).
// It returns at most max deliveries, the caller's own pending (unacknowledged)
// deliveries first. Ack acknowledges deliveries by Ref after the inbox
// transaction committed. DeadLetter moves a delivery that can never succeed
// (malformed) out of the way, with the reason, and acknowledges it; it
// returns an error wrapping ErrSettled when another consumer had settled
// the delivery already (then it did nothing).
type Source interface {
	Fetch(ctx context.Context, max int) ([]Delivery, error)
	Ack(ctx context.Context, refs ...string) error
	DeadLetter(ctx context.Context, d Delivery, reason string) error
}

// Handler applies one delivery inside the inbox transaction.
//
// Apply must record d in the inbox table keyed by its idempotency key with
// INSERT ... ON CONFLICT DO NOTHING and report fresh=true only when the row
// is new; it must apply any side effects (e.g. a NOTIFY for a gateway) only
// when fresh. It must not commit or roll back tx.
//
// Errors:
//   - An error wrapping ErrMalformed means the input can never succeed
//     (undecodable payload, missing id). Apply must return it BEFORE touching
//     tx: decode and validate first, then write. The Consumer keeps using tx
//     for the other deliveries of the batch and dead-letters d after the
//     commit. (Touching tx and then returning ErrMalformed may leave tx
//     aborted; the batch then fails with SQLSTATE 25P02 and is retried
//     forever.)
//   - A Postgres error of SQLSTATE class 22 (data exception) or 23
//     (integrity constraint violation), returned as is or wrapped, is
//     permanent: the batch is rolled back and re-run one delivery per
//     transaction, and the failing delivery is dead-lettered.
//   - Any other error is transient: the batch is rolled back, nothing is
//     acknowledged, and the batch is retried after a backoff.
//
// Apply is called by one goroutine at a time per Consumer, in delivery
// order.
type Handler interface {
	Apply(ctx context.Context, tx pgx.Tx, d Delivery) (fresh bool, err error)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, tx pgx.Tx, d Delivery) (bool, error)

// Apply calls f(ctx, tx, d).
func (f HandlerFunc) Apply(ctx context.Context, tx pgx.Tx, d Delivery) (bool, error) {
	return f(ctx, tx, d)
}

var _ Handler = HandlerFunc(nil)

// BatchHandler is an optional interface of a Handler: it applies a whole
// batch inside the inbox transaction, in as few round trips as it can (one
// statement for the batch instead of one per delivery). The Consumer uses
// it instead of Apply when the Handler has it.
//
// ApplyBatch must have exactly the effect of calling Apply on ds in order:
// it returns one BatchResult per delivery, in the order of ds. A delivery
// that is malformed gets a result whose Err wraps ErrMalformed and must leave
// no trace in tx; a delivery whose id repeats an earlier one in ds (or a row
// already in the inbox) is a duplicate (Fresh false). Returning an error
// rolls the whole batch back, classified as for Apply (permanent errors are
// isolated by re-running one delivery per transaction, through ApplyBatch
// with a one-element slice). Called by one goroutine at a time per Consumer.
type BatchHandler interface {
	Handler
	ApplyBatch(ctx context.Context, tx pgx.Tx, ds []Delivery) ([]BatchResult, error)
}

// PipelineHandler is an optional interface of a BatchHandler whose work is
// statements that need no answer before the next one is sent. The Consumer
// then runs the whole inbox transaction — BEGIN, the synchronous_commit
// guard, the handler's statements and COMMIT — as one pipelined pgx.Batch:
// one round trip per batch instead of three (BEGIN, statement, COMMIT), on
// every message's way to the screen.
//
// QueueBatch must queue on b statements whose effect is that of
// ApplyBatch(ds), and fill rs (len(ds), zero on entry) as ApplyBatch's
// result: Err (wrapping ErrMalformed) for a malformed delivery before
// queueing, nothing queued for it; Fresh and Value from the queued
// statements' result callbacks (pgx.QueuedQuery.Query, QueryRow, Exec),
// which run in queue order while the Consumer reads the batch, before its
// COMMIT's result. A failing statement rolls the batch back (the server
// skips the rest of the pipeline, COMMIT included) and its error is
// classified as for ApplyBatch; so is an error QueueBatch returns, before
// anything is sent. A callback's own error (a scan that fails after its
// statement succeeded) cannot stop the COMMIT, which the server has already
// run: the batch is reported failed, retried, and its deliveries then count
// as duplicates — at least once still holds. Called by one goroutine at a
// time per Consumer.
type PipelineHandler interface {
	BatchHandler
	QueueBatch(b *pgx.Batch, ds []Delivery, rs []BatchResult) error
}

// MergeHandler is an optional interface of a PipelineHandler whose
// batches a Group can merge: in a shared transaction whose members'
// handlers are all MergeHandlers, the Group calls QueueMerged of the first
// member's handler once, with every member's handler, deliveries and
// results, instead of each member's QueueBatch, so that the members'
// deliveries can share statements (one insert for all, say).
//
// QueueMerged must have the effect of calling hs[i].QueueBatch(b, ds[i],
// rs[i]) for each member i in order, and fill each rs[i] as that would:
// every delivery's outcome is its own member's. An error means nothing was
// queued (a handler it cannot merge with, say): the members then run their
// batches alone. Called by one goroutine at a time per Group.
type MergeHandler interface {
	PipelineHandler
	QueueMerged(b *pgx.Batch, hs []PipelineHandler, ds [][]Delivery, rs [][]BatchResult) error
}

// BatchResult is the outcome of one delivery of BatchHandler.ApplyBatch:
// Fresh reports a new inbox row; a non-nil Err (wrapping ErrMalformed)
// dead-letters the delivery. Value is optional data of a fresh delivery
// (what the handler stored, say) that the Consumer hands to
// Config.AfterCommit once the transaction has committed; it is dropped if
// the transaction rolls back.
type BatchResult struct {
	Fresh bool
	Err   error
	Value any
}

// Applied is one delivery a committed inbox transaction recorded as new,
// with the Value its BatchResult carried (nil for a plain Handler).
type Applied struct {
	// Delivery is the delivery as the Source gave it.
	Delivery Delivery
	// Value is BatchResult.Value of the delivery (nil for a plain Handler).
	Value any
}
