package redisq

import (
	"context"
	"errors"
	"fmt"

	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/outbox"
)

// InboxSource adapts a Consumer to inbox.Source, so that an inbox.Consumer
// reads a redisq consumer group: Fetch, Ack and DeadLetter call the
// Consumer's, with inbox.Delivery.Ref = Delivery.StreamID and ID, Name,
// Payload, Sig, Headers and Err copied from the entry; DeadLetter of an
// entry another consumer had settled already returns an error wrapping
// inbox.ErrSettled (Consumer.DeadLetterPending). It adds no state; it is safe for
// concurrent use as the Consumer is.
func InboxSource(c *Consumer) inbox.Source { return inboxSource{c} }

type inboxSource struct{ c *Consumer }

func (s inboxSource) Fetch(ctx context.Context, max int) ([]inbox.Delivery, error) {
	ds, err := s.c.Fetch(ctx, max)
	if err != nil {
		return nil, err
	}
	out := make([]inbox.Delivery, len(ds))
	for i, d := range ds {
		out[i] = inbox.Delivery{Ref: d.StreamID, ID: d.ID, Name: d.Name, Payload: d.Payload, Sig: d.Sig, Headers: d.Headers, Err: d.Err}
	}
	return out, nil
}

func (s inboxSource) Ack(ctx context.Context, refs ...string) error { return s.c.Ack(ctx, refs...) }

func (s inboxSource) DeadLetter(ctx context.Context, d inbox.Delivery, reason string) error {
	moved, err := s.c.DeadLetterPending(ctx, Delivery{Job: Job{ID: d.ID, Name: d.Name, Payload: d.Payload, Sig: d.Sig, Headers: d.Headers}, StreamID: d.Ref}, reason)
	if err == nil && !moved {
		return fmt.Errorf("redisq: dead-lettering %s: %w", d.Ref, inbox.ErrSettled)
	}
	return err
}

// OutboxPublisher adapts a Publisher to outbox.Publisher, so that an
// outbox.Relay publishes into a redisq stream: each outbox.Message becomes
// a Job with ID = Message.ID (the idempotency key), Name = Message.Event,
// Payload = Message.Payload and Headers = Message.Headers, added in order with one Add (a
// re-published message is a successful no-op while its job is in the
// stream). Errors are Add's; one that is a job's own fault (JobFault: an
// empty ID, an "ERR" reply to its XADD) is returned as an
// *outbox.MessageError naming its row, after the jobs before it were
// added, so the relay parks that row rather than retrying the batch for
// ever. Safe for concurrent use.
func OutboxPublisher(p *Publisher) outbox.Publisher {
	return outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) error {
		jobs := make([]Job, len(msgs))
		for i, m := range msgs {
			jobs[i] = Job{ID: m.ID, Name: m.Event, Payload: m.Payload, Headers: m.Headers}
		}
		_, err := p.Add(ctx, jobs...)
		je, own := JobFault(err)
		if !own {
			return err
		}
		if errors.Is(je.Err, ErrInvalidJob) && je.Index > 0 {
			// Nothing was sent: the jobs before it go now.
			if _, err := p.Add(ctx, jobs[:je.Index]...); err != nil {
				return err
			}
		}
		return &outbox.MessageError{RowID: msgs[je.Index].RowID, Err: err}
	})
}
