package probe

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/lab/env"
	"github.com/outboxchat/outboxchat/natsq"
)

// natsRead reads JetStream stream l.stream from its first message until
// ctx ends, riding out nats-server restarts: an ordered consumer (no
// acks, no durable state on the server) made again from the next stream
// seq after every error, so that each message is read once.
func (t *Tap) natsRead(ctx context.Context, l lane) {
	next := uint64(1)
	for ctx.Err() == nil {
		c, err := t.js.OrderedConsumer(ctx, l.stream, jetstream.OrderedConsumerConfig{
			DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: next})
		if err != nil {
			_ = env.SleepUntil(ctx, time.Now().Add(100*time.Millisecond))
			continue
		}
		for ctx.Err() == nil {
			batch, err := c.Fetch(500, jetstream.FetchMaxWait(300*time.Millisecond))
			if err != nil {
				break
			}
			for m := range batch.Messages() {
				md, err := m.Metadata()
				if err != nil || md.Sequence.Stream < next {
					continue
				}
				next = md.Sequence.Stream + 1
				t.entry(l, strconv.FormatUint(md.Sequence.Stream, 10), m.Headers().Get(natsq.HeaderEvent), string(m.Data()))
			}
			if batch.Error() != nil && !errors.Is(batch.Error(), nats.ErrTimeout) {
				break
			}
		}
	}
}

// natsAcked returns the entries of cand (stream seq → message id) that
// durable consumer receiver of stream has acknowledged: those at or below
// its ack floor. nil when JetStream cannot say.
func (t *Tap) natsAcked(ctx context.Context, stream, receiver string, cand map[string]string) map[string]string {
	c, err := t.js.Consumer(ctx, stream, chat.NATSName(receiver))
	if err != nil {
		return nil
	}
	floor := c.CachedInfo().AckFloor.Stream
	acked := map[string]string{}
	for ref, id := range cand {
		if seq, err := strconv.ParseUint(ref, 10, 64); err == nil && seq <= floor {
			acked[ref] = id
		}
	}
	return acked
}

// natsDrained is StreamDrained on JetStream: every partition's durable
// consumer of the receiver has nothing pending nor unacknowledged.
func natsDrained(ctx context.Context, e *env.Env, from string) string {
	for p := range max(e.Partitions, 1) {
		n, err := e.NATSPending(ctx, from, chat.Peer(from), p)
		if err != nil {
			return "nats: " + err.Error()
		}
		if n > 0 {
			stream, _, _ := env.NATSStreams(from, p)
			return fmt.Sprintf("%s consumer %s: %d pending or unacknowledged", stream, chat.Peer(from), n)
		}
	}
	return ""
}

// natsInjectMalformed is InjectMalformed on JetStream: a message on the
// stream's subject with Nats-Msg-Id id and the event name, no signature,
// a payload that is not an event.
func natsInjectMalformed(ctx context.Context, e *env.Env, from, id string) error {
	nc, err := e.NATSConn()
	if err != nil {
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	_, _, subject := env.NATSStreams(from, 0)
	m := nats.NewMsg(subject)
	m.Header.Set(jetstream.MsgIDHeader, id)
	m.Header.Set(natsq.HeaderEvent, chat.EventMessageCreated)
	m.Data = []byte("{not an event")
	_, err = js.PublishMsg(ctx, m)
	return err
}

// natsDeadLetters is DeadLetters on JetStream: the messages in the
// queue's dead-letter stream (0 before it exists).
func natsDeadLetters(ctx context.Context, e *env.Env, from string) (int64, error) {
	nc, err := e.NATSConn()
	if err != nil {
		return 0, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, err
	}
	_, dead, _ := env.NATSStreams(from, 0)
	st, err := js.Stream(ctx, dead)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return int64(st.CachedInfo().State.Msgs), nil
}
