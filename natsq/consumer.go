package natsq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/internal/natsname"
	"github.com/outboxchat/outboxchat/outbox"
)

// ConsumerConfig configures a group's consumer. Zero durations mean the
// defaults.
type ConsumerConfig struct {
	// Group names the consumer group (required; letters, digits, - and _):
	// the durable consumer's name. Every group gets every event; the
	// consumers of one group share them.
	Group string
	// LockDuration is the consumer's AckWait (default DefaultLockDuration):
	// an event fetched and not acknowledged within it is delivered again,
	// to any consumer of the group. Keep it above the longest time a batch
	// takes to process.
	LockDuration time.Duration
	// MaxDeliver bounds the deliveries of one event (default 0: no
	// bound): Fetch moves an event delivered more often than this (its
	// consumers crashed or timed out on it each time) to the dead-letter
	// stream, reason "delivered N times without an ack", instead of
	// returning it. Fetch enforces it, not the server's own MaxDeliver,
	// whose only signal is an advisory that nobody may be listening for.
	MaxDeliver int
	// FetchWait is the longest Fetch waits for a first event (default
	// DefaultFetchWait).
	FetchWait time.Duration
}

// Consumer reads a Queue as a member of a consumer group. Its methods are
// safe for concurrent use; it holds no events in memory (an ack names the
// delivery by its reply subject, which the server knows).
type Consumer struct {
	q    *Queue
	cons jetstream.Consumer
	cfg  ConsumerConfig
}

// NewConsumer creates or updates the group's durable pull consumer
// (explicit acks, from the stream's first event) and returns a Consumer on
// it, asking again as New does. Errors wrap ErrInvalidConfig, or are the
// server's, or ctx's.
func (q *Queue) NewConsumer(ctx context.Context, cfg ConsumerConfig) (*Consumer, error) {
	if !natsname.Valid(cfg.Group) {
		return nil, fmt.Errorf("natsq: group %q: letters, digits, - and _: %w", cfg.Group, ErrInvalidConfig)
	}
	if cfg.LockDuration <= 0 {
		cfg.LockDuration = DefaultLockDuration
	}
	if cfg.FetchWait <= 0 {
		cfg.FetchWait = DefaultFetchWait
	}
	cons, err := ensure(ctx, func(ctx context.Context) (jetstream.Consumer, error) {
		return q.js.CreateOrUpdateConsumer(ctx, q.stream, jetstream.ConsumerConfig{
			Durable: cfg.Group, AckPolicy: jetstream.AckExplicitPolicy, AckWait: cfg.LockDuration,
			MaxDeliver: -1, FilterSubject: q.subject, DeliverPolicy: jetstream.DeliverAllPolicy,
		})
	})
	if err != nil {
		return nil, fmt.Errorf("natsq: consumer %s on %s: %w", cfg.Group, q.stream, err)
	}
	return &Consumer{q: q, cons: cons, cfg: cfg}, nil
}

// Delivery is one delivered event. Ref is what Ack and DeadLetter take
// (the delivery's reply subject); StreamSeq the event's sequence in the
// stream; Delivered how many times it was delivered (1 the first time).
type Delivery struct {
	Event
	Ref       string
	StreamSeq uint64
	Delivered uint64
}

// Fetch returns up to max deliveries: at once what is there, else it waits
// up to FetchWait for a first event and takes what came with it. An empty
// result with a nil error means nothing came. The wait ends early when ctx
// ends (an inbox.Consumer's Stop), with an error wrapping ctx.Err(); an
// event the server handed to that cancelled wait is delivered again after
// the lock duration (at-least-once).
func (c *Consumer) Fetch(ctx context.Context, max int) ([]Delivery, error) {
	if max <= 0 {
		return nil, nil
	}
	out, err := c.take(ctx, max, 0)
	if len(out) > 0 || err != nil {
		return out, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if out, err = c.take(ctx, 1, c.cfg.FetchWait); len(out) == 0 || err != nil || max == 1 {
		return out, err
	}
	more, err := c.take(ctx, max-1, 0)
	return append(out, more...), err
}

// take runs one pull request: no wait when wait is 0, else a wait of at
// most wait that ends with ctx.
func (c *Consumer) take(ctx context.Context, n int, wait time.Duration) ([]Delivery, error) {
	var b jetstream.MessageBatch
	var err error
	if wait == 0 {
		b, err = c.cons.FetchNoWait(n)
	} else {
		// FetchContext asks the server to expire the pull a little before
		// the deadline (jetstream's own margin), and stops waiting when ctx
		// is cancelled; FetchMaxWait would hold a stopping consumer for
		// the whole wait.
		wctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		b, err = c.cons.Fetch(n, jetstream.FetchContext(wctx))
	}
	if err != nil {
		return nil, fmt.Errorf("natsq: fetch: %w", err)
	}
	var out []Delivery
	for m := range b.Messages() {
		d := Delivery{Event: eventOf(m.Headers(), m.Data()), Ref: m.Reply()}
		if meta, err := m.Metadata(); err == nil {
			d.StreamSeq, d.Delivered = meta.Sequence.Stream, meta.NumDelivered
		}
		if c.cfg.MaxDeliver > 0 && d.Delivered > uint64(c.cfg.MaxDeliver) {
			reason := fmt.Sprintf("delivered %d times without an ack", d.Delivered-1)
			if err := c.DeadLetter(context.Background(), d, reason); err != nil {
				return out, err // it is delivered again after the lock duration
			}
			continue
		}
		out = append(out, d)
	}
	if err := b.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, jetstream.ErrNoMessages) {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return out, nil // the wait ran out: nothing came
		}
		return out, fmt.Errorf("natsq: fetch: %w", err)
	}
	return out, nil
}

// Ack acknowledges deliveries by Ref, in one round trip (the acks are
// pipelined, then a flush waits for the server to have read them). An ack
// that is lost (the server went away) redelivers the event after the lock
// duration: at-least-once, the inbox drops the repeat.
func (c *Consumer) Ack(ctx context.Context, refs ...string) error {
	for _, r := range refs {
		if err := c.q.nc.Publish(r, []byte("+ACK")); err != nil {
			return fmt.Errorf("natsq: ack: %w", err)
		}
	}
	if err := c.flush(ctx); err != nil {
		return fmt.Errorf("natsq: ack: %w", err)
	}
	return nil
}

// flushTimeout bounds a flush whose ctx has no deadline.
const flushTimeout = 5 * time.Second

// flush waits until the server has read what this connection sent (a
// PING/PONG round trip), within ctx or flushTimeout.
func (c *Consumer) flush(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, flushTimeout)
		defer cancel()
	}
	return c.q.nc.FlushWithContext(ctx)
}

// DeadLetter copies d into the dead-letter stream with reason (its id as
// Nats-Msg-Id, so a repeat within the window adds nothing) and then
// terminates it in the group (+TERM: never delivered to the group again).
// The copy is stored before the termination, so a crash between the two
// delivers d again rather than losing it. Unlike redisq, it cannot tell
// that another consumer settled d already (after its lock duration): then
// the dead letter is a copy of an event that was also handled.
func (c *Consumer) DeadLetter(ctx context.Context, d Delivery, reason string) error {
	m := c.q.message(c.q.deadSubj, d.Event)
	if d.ID != "" {
		m.Header.Set(HeaderID, d.ID)
	}
	m.Header.Set(HeaderReason, reason)
	m.Header.Set(HeaderOrigin, strconv.FormatUint(d.StreamSeq, 10))
	opts := []jetstream.PublishOpt{}
	if d.ID != "" {
		opts = append(opts, jetstream.WithMsgID(d.ID))
	}
	if _, err := c.q.js.PublishMsg(ctx, m, opts...); err != nil {
		return fmt.Errorf("natsq: dead-letter %s: %w", d.ID, err)
	}
	if err := c.q.nc.Publish(d.Ref, []byte("+TERM")); err != nil {
		return fmt.Errorf("natsq: dead-letter %s: terminate: %w", d.ID, err)
	}
	if err := c.flush(ctx); err != nil {
		return fmt.Errorf("natsq: dead-letter %s: terminate: %w", d.ID, err)
	}
	return nil
}

// InboxSource adapts a Consumer to inbox.Source: inbox.Delivery.Ref is
// Delivery.Ref, and ID, Name, Payload, Headers and Sig are the event's. A
// delivery without a Nats-Msg-Id (not published by natsq) carries an Err
// wrapping inbox.ErrMalformed, which the inbox dead-letters. DeadLetter
// never returns inbox.ErrSettled (see Consumer.DeadLetter). It adds no
// state and is safe for concurrent use.
func InboxSource(c *Consumer) inbox.Source { return inboxSource{c} }

type inboxSource struct{ c *Consumer }

func (s inboxSource) Fetch(ctx context.Context, max int) ([]inbox.Delivery, error) {
	ds, err := s.c.Fetch(ctx, max)
	out := make([]inbox.Delivery, len(ds))
	for i, d := range ds {
		out[i] = inbox.Delivery{Ref: d.Ref, ID: d.ID, Name: d.Name, Payload: d.Payload, Headers: d.Headers, Sig: d.Sig}
		if d.ID == "" {
			out[i].Err = fmt.Errorf("natsq: event at stream seq %d has no %s: %w", d.StreamSeq, jetstream.MsgIDHeader, inbox.ErrMalformed)
		}
	}
	return out, err
}

func (s inboxSource) Ack(ctx context.Context, refs ...string) error { return s.c.Ack(ctx, refs...) }

func (s inboxSource) DeadLetter(ctx context.Context, d inbox.Delivery, reason string) error {
	return s.c.DeadLetter(ctx, Delivery{Event: Event{ID: d.ID, Name: d.Name, Payload: d.Payload, Headers: d.Headers, Sig: d.Sig}, Ref: d.Ref}, reason)
}

// OutboxPublisher adapts a Queue to outbox.Publisher, so that an
// outbox.Relay publishes into a JetStream stream: each outbox.Message
// becomes an Event with ID = Message.ID (the idempotency key), Name =
// Message.Event, Payload and Headers; the batch is published in order with
// one Publish. An event that can never be published (an empty id, over
// the server's max payload) is returned as an *outbox.MessageError naming
// its row, after the events before it were published, so the relay parks
// that row; any other error is the broker's and is returned as is (the
// relay retries the batch). Safe for concurrent use.
func OutboxPublisher(q *Queue) outbox.Publisher {
	return outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) error {
		evs := make([]Event, len(msgs))
		for i, m := range msgs {
			evs[i] = Event{ID: m.ID, Name: m.Event, Payload: m.Payload, Headers: m.Headers}
		}
		err := q.Publish(ctx, evs...)
		var ee *EventError
		if !errors.As(err, &ee) {
			return err
		}
		if ee.Index > 0 {
			if err := q.Publish(ctx, evs[:ee.Index]...); err != nil {
				return err
			}
		}
		return &outbox.MessageError{RowID: msgs[ee.Index].RowID, Err: err}
	})
}
