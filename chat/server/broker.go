package server

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/receive"
	"github.com/outboxchat/outboxchat/chat/store"
	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/natsq"
	"github.com/outboxchat/outboxchat/redisq"
)

// NATSMaxAge is how long the chat's JetStream streams keep an event,
// delivered or not (natsq.Config.MaxAge). The streams keep every event
// (limits retention: each consumer group reads them all), so something
// must bound them; a day is far above any outage the relay rides out,
// and an event older than it that never got its receipt is published
// again by the re-drive.
const NATSMaxAge = 24 * time.Hour

// isNATS reports whether url names a NATS server (Config.BrokerURL).
func isNATS(url string) bool {
	for _, u := range strings.Split(url, ",") {
		u = strings.TrimSpace(u)
		if !strings.HasPrefix(u, "nats://") && !strings.HasPrefix(u, "tls://") {
			return false
		}
	}
	return url != ""
}

// redactURL is a broker URL fit for an error message: each part's
// password as "xxxxx", and a part that does not parse as "<unparsable>".
func redactURL(s string) string {
	parts := strings.Split(s, ",")
	for i, part := range parts {
		u, err := url.Parse(strings.TrimSpace(part))
		if err != nil {
			parts[i] = "<unparsable>"
			continue
		}
		parts[i] = u.Redacted()
	}
	return strings.Join(parts, ",")
}

// connectNATS dials Config.BrokerURL when the queue is on NATS (the relay
// and worker roles). A server that is away at start fails the start: the
// streams are made sure of there.
func (p *process) connectNATS() error {
	nc, err := natsq.Connect(p.cfg.BrokerURL, nats.Name("outboxchat-"+p.cfg.Service),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			p.log.Warn("nats disconnected; the relay's rows wait in the outbox", "err", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) { p.log.Info("nats reconnected", "server", nc.ConnectedUrlRedacted()) }))
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	p.nc = nc
	return nil
}

// natsQueue makes sure of the streams of partition part's queue from
// service from (chat.PartitionQueue) and returns it; sign, when set, signs
// its events.
func (p *process) natsQueue(from string, part int, sign func(redisq.Job) string) (*natsq.Queue, error) {
	cfg := natsq.Config{Queue: chat.NATSName(chat.PartitionQueue(from, part)), Prefix: chat.NATSName(p.cfg.RedisPrefix),
		MaxAge: NATSMaxAge, Replicas: p.cfg.BrokerReplicas}
	if sign != nil {
		cfg.Sign = func(e natsq.Event) string {
			return sign(redisq.Job{ID: e.ID, Name: e.Name, Payload: e.Payload, Headers: e.Headers})
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), natsSetupTimeout)
	defer cancel()
	q, err := natsq.New(ctx, p.nc, cfg)
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	return q, nil
}

// natsSetupTimeout bounds making sure of one queue's streams or consumer
// at start.
const natsSetupTimeout = 10 * time.Second

// natsSource is the worker's source of partition part on NATS: the
// service's durable consumer (its group) of the peer's queue, AckWait the
// lock duration. Its members need no names: a pull consumer hands each
// fetch what no member holds, and an event a member fetched and did not
// acknowledge goes to any member after the lock duration.
func (p *process) natsSource(part int) (inbox.Source, error) {
	q, err := p.natsQueue(chat.Peer(p.cfg.Service), part, nil)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), natsSetupTimeout)
	defer cancel()
	c, err := q.NewConsumer(ctx, natsq.ConsumerConfig{Group: chat.NATSName(p.cfg.Service), LockDuration: p.cfg.LockDuration})
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	return natsq.InboxSource(c), nil
}

// natsRepublisher is the re-drive's publisher on NATS: Readd is
// natsq.Queue.Republish, which stores the events again inside the
// duplicate window.
type natsRepublisher struct{ q *natsq.Queue }

var _ receive.Republisher = natsRepublisher{}

// natsAdder is the v1 dual write's add on NATS (natsq.Queue.Publish).
type natsAdder struct{ q *natsq.Queue }

var _ store.Adder = natsAdder{}

func (a natsAdder) Add(ctx context.Context, jobs ...redisq.Job) (int, error) {
	if err := a.q.Publish(ctx, natsEvents(jobs)...); err != nil {
		return 0, err
	}
	return len(jobs), nil
}

// natsEvents are jobs as natsq events.
func natsEvents(jobs []redisq.Job) []natsq.Event {
	evs := make([]natsq.Event, len(jobs))
	for i, j := range jobs {
		evs[i] = natsq.Event{ID: j.ID, Name: j.Name, Payload: j.Payload, Headers: j.Headers, Sig: j.Sig}
	}
	return evs
}

func (r natsRepublisher) Readd(ctx context.Context, jobs ...redisq.Job) (int, error) {
	if err := r.q.Republish(ctx, natsEvents(jobs)...); err != nil {
		var ee *natsq.EventError
		if errors.As(err, &ee) {
			return ee.Index, err
		}
		return 0, err
	}
	return len(jobs), nil
}
