package server

import (
	"sync/atomic"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/gateway"
	"github.com/outboxchat/outboxchat/chat/receive"
	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/outbox"
	"github.com/outboxchat/outboxchat/redisq"
)

// receiptWakeDelay is how long after an inbox commit this process's relay
// is woken for the receipt it enqueued: receipts of the batches committed
// meanwhile ride on the same relay pass. It delays "✓✓ delivered" by at
// most this much.
const receiptWakeDelay = 50 * time.Millisecond

// buildGateway builds the WebSocket gateway of the api role.
func (p *process) buildGateway() error {
	c := p.cfg
	// This process's sends and inbox commits are offered to the gateway
	// directly (store.Config.AfterCommit, inbox.Config.AfterCommit): drop
	// their notifications; other processes' arrive through LISTEN.
	skip := []string{chat.OutboxChannel(c.Service)}
	if c.has(RoleWorker) {
		skip = append(skip, chat.InboxChannel(c.Service), chat.ReceiptChannel(c.Service))
	}
	gw, err := gateway.New(p.pool, c.Service, &gateway.Config{
		Channels: []string{chat.InboxChannel(c.Service), chat.OutboxChannel(c.Service), chat.ReceiptChannel(c.Service),
			chat.ChangeChannel(c.Service), chat.ReadChannel(c.Service)},
		GapTimeout: c.API.GapTimeout, Logger: p.log, Notifier: p.listener, SkipOwnOn: skip, PollInterval: c.gatewayPoll,
		OnPush: p.pushTracer(),
	})
	if err != nil {
		return err
	}
	p.gw = gw
	p.m.subscribers(gw.Subscribers)
	return nil
}

// buildWorker builds the worker role: the stream from the peer into the
// inbox. It starts before the relay and stops after it: it must finish and
// ack its batch before connections close.
func (p *process) buildWorker() error {
	c := p.cfg
	h, err := receive.NewInboxHandler(c.Service, p.keys)
	if err != nil {
		return err
	}
	qc, err := redisq.NewConsumer(p.rdb, &redisq.ConsumerConfig{
		Queue: chat.QueueName(chat.Peer(c.Service)), Prefix: c.RedisPrefix, Group: c.Service,
		Consumer: c.Worker.ConsumerName, LockDuration: c.LockDuration, Logger: p.log, DeadLetterMax: c.Worker.DeadLetterMax,
		OnEvent: p.m.queueEvents(p.log, c.LockDuration),
	})
	if err != nil {
		return err
	}
	p.m.deletedPending(qc.DeletedPending)
	var src inbox.Source = redisq.InboxSource(qc)
	var handler inbox.Handler = h
	if c.Hooks != nil {
		src, handler = c.Hooks.Source(src), c.Hooks.Handler(handler)
	}
	// The inbox transaction enqueued a receipt in this service's outbox:
	// wake this process's relay for it, at most once per receiptWakeDelay,
	// so that under load one relay pass carries the receipts of many inbox
	// batches (another process's relay finds them at its next wake-up or
	// poll).
	var wakePending atomic.Bool
	observeE2E := p.m.e2e()
	gw := p.gw
	// The gateways of this service's other processes hear of the commit
	// from the waker, after it: the inbox transaction runs no NOTIFY.
	// Spaced like the send path's NOTIFY (notifyInterval): this process's
	// own gateway is handed the rows directly, the others can wait a few
	// milliseconds under load, and one statement then carries several
	// batches.
	waker, err := receive.NewWaker(p.pool, c.Service, &receive.WakerConfig{Logger: p.log, Interval: notifyInterval})
	if err != nil {
		return err
	}
	var clock *fetchClock
	if p.tracer.Enabled() {
		clock = &fetchClock{Source: src}
		src = clock
	}
	afterCommit := func(applied []inbox.Applied) {
		observeE2E(applied)
		if clock != nil {
			traceApplied(p.tracer, clock, applied)
		}
		if gw != nil {
			gw.OfferApplied(applied)
		}
		waker.Committed(applied)
		if wake := p.relayWake; wake != nil && wakePending.CompareAndSwap(false, true) {
			time.AfterFunc(receiptWakeDelay, func() { wakePending.Store(false); wake() })
		}
	}
	ic, err := inbox.NewConsumer(p.pool, src, handler, &inbox.Config{
		Logger: p.log, OnEvent: p.m.inboxEvents(p.log), AfterCommit: afterCommit,
	})
	if err != nil {
		return err
	}
	held, err := receive.NewHeldChanges(p.pool, c.Service, 0, p.log)
	if err != nil {
		return err
	}
	// The waker is started before the consumer and stopped after it, so
	// that the last batch's wake-up is sent.
	p.add(waker, ic, held)
	p.announce = append(p.announce, func() {
		p.log.Info("worker started", "queue", chat.QueueName(chat.Peer(c.Service)), "consumer", c.Worker.ConsumerName)
	})
	return nil
}

// publisherConfig is the config of the publisher to the peer's stream
// (the relay's and the v1 dual writer's).
func (p *process) publisherConfig() *redisq.PublisherConfig {
	c := p.cfg
	pc := &redisq.PublisherConfig{Queue: chat.QueueName(c.Service), Prefix: c.RedisPrefix, Logger: p.log}
	if p.keys != nil {
		pc.Sign = p.keys.Signer(chat.QueueName(c.Service))
	}
	return pc
}

// buildRelay builds the relay role: the outbox relay, its heartbeat and
// vacuum, and the re-drive.
func (p *process) buildRelay() error {
	c := p.cfg
	pub, err := redisq.NewPublisher(p.rdb, p.publisherConfig())
	if err != nil {
		return err
	}
	op := p.fence.Publisher(redisq.OutboxPublisher(pub))
	if c.Hooks != nil {
		op = c.Hooks.Publisher(op)
	}
	if p.tracer.Enabled() {
		op = tracedPublisher(op, p.tracer)
	}
	relay, err := outbox.NewRelay(p.pool, &outbox.RelayConfig{
		Table: c.Service + ".outbox", Channel: chat.OutboxChannel(c.Service), Publisher: op,
		PollInterval: c.Relay.PollInterval, DisableListen: c.Relay.PollOnly, Logger: p.log,
		OnEvent: p.m.relayEvents(p.log), Notifier: p.listener, MaxAttempts: c.Relay.MaxAttempts,
		// This process's sends wake the relay directly; their NOTIFYs (for
		// other processes) would only cause a second pass here.
		SkipOwnNotifications: c.directRelayWake(),
	})
	if err != nil {
		return err
	}
	var listening func() bool
	if !c.Relay.PollOnly {
		listening = relay.Listening
	}
	p.add(relay, newHeartbeat(p.pool, c.Service, c.Worker.ConsumerName, relay.LastPass, listening, p.log))
	if c.Relay.OutboxVacuumRows >= 0 {
		vac, err := outbox.NewVacuum(p.pool, &outbox.VacuumConfig{
			Table: c.Service + ".outbox", DeadRows: c.Relay.OutboxVacuumRows, Logger: p.log,
		})
		if err != nil {
			return err
		}
		p.add(vac)
	}
	if keep := c.Relay.HistoryRetention; keep > 0 {
		p.add(newRetention(p.pool, c.Service, keep, p.m.pruned(), p.log))
	}
	if after := c.Relay.RedriveAfter; after > 0 {
		rd, err := receive.NewRedriver(p.pool, c.Service, pub, &receive.RedriveConfig{
			After: after, Logger: p.log, Redriven: p.m.redriven(),
		})
		if err != nil {
			return err
		}
		p.add(rd)
		p.announce = append(p.announce, func() { p.log.Info("re-drive started", "after", after) })
	}
	if !c.Relay.PollOnly {
		// Poll-only means the relay moves at its poll alone: an inbox
		// commit's receipt wake-up would publish this process's pending
		// messages too, and the poll would no longer be what is measured.
		p.relayWake = relay.Wake
	}
	p.announce = append(p.announce, func() {
		p.log.Info("relay started", "queue", chat.QueueName(c.Service), "poll_only", c.Relay.PollOnly)
	})
	return nil
}

// pushTracer is the gateway's OnPush: nil when tracing is off.
func (p *process) pushTracer() func(chat.Message, time.Time) {
	if !p.tracer.Enabled() {
		return nil
	}
	return tracePush(p.tracer)
}
