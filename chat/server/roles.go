package server

import (
	"slices"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/gateway"
	"github.com/outboxchat/outboxchat/chat/receive"
	"github.com/outboxchat/outboxchat/chat/server/internal/heartbeat"
	"github.com/outboxchat/outboxchat/chat/server/internal/retention"
	"github.com/outboxchat/outboxchat/chat/server/internal/tracing"
	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/internal/service"
	"github.com/outboxchat/outboxchat/natsq"
	"github.com/outboxchat/outboxchat/outbox"
	"github.com/outboxchat/outboxchat/redisq"
)

// receiptWakeDelay is how long after an inbox commit the relay is woken
// for the receipt it enqueued: receipts of the batches committed
// meanwhile ride on the same relay pass. It delays "✓✓ delivered" by at
// most this much.
const receiptWakeDelay = 50 * time.Millisecond

// buildGateway builds the WebSocket gateway of the api role.
func (p *process) buildGateway() error {
	c := p.cfg
	// This process's sends and inbox commits are offered to the gateway
	// directly (store.Config.AfterCommit, inbox.Config.AfterCommit): drop
	// their notifications; other processes' arrive through LISTEN.
	var outboxes []string
	for part := range c.Partitions {
		outboxes = append(outboxes, chat.PartitionOutboxChannel(c.Service, part))
	}
	skip := outboxes
	if c.has(RoleWorker) {
		skip = append(slices.Clip(skip), chat.InboxChannel(c.Service), chat.ReceiptChannel(c.Service))
	}
	gw, err := gateway.New(p.pool, c.Service, &gateway.Config{
		Channels: append([]string{chat.InboxChannel(c.Service), chat.ReceiptChannel(c.Service),
			chat.ChangeChannel(c.Service), chat.ReadChannel(c.Service)}, outboxes...),
		GapTimeout: c.API.GapTimeout, Logger: p.log, Notifier: p.listener, SkipOwnOn: skip, PollInterval: c.gatewayPoll,
		OnPush: p.pushTracer(),
	})
	if err != nil {
		return err
	}
	p.gw = gw
	p.m.Subscribers(gw.Subscribers)
	return nil
}

// buildWorker builds the worker role: the streams from the peer into the
// inbox, one consumer per partition (every worker process consumes every
// partition's stream in its consumer group: the group spreads the entries
// over the processes, as with one partition, and no lease is needed; a
// stream's keys live in one cluster slot, so each partition has its own
// blocking read). It starts before the relay and stops after it: it must
// finish and ack its batch before connections close.
func (p *process) buildWorker() error {
	c := p.cfg
	h, err := receive.NewInboxHandler(c.Service, p.keys)
	if err != nil {
		return err
	}
	onQueue := p.m.QueueEvents(p.log, c.LockDuration)
	onInbox := p.m.InboxEvents(p.log)
	observeE2E := p.m.E2E()
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
	var deleted []func() int64
	var consumers []service.Service
	// With partitions, the consumers of all of them share their inbox
	// transactions (inbox.Group): the batches of several partitions that
	// arrive together commit in one, as one partition's would.
	var group *inbox.Group
	if c.Partitions > 1 {
		if group, err = inbox.NewGroup(p.pool); err != nil {
			return err
		}
		p.m.SharedWork("outboxchat_inbox_shared", "batches", "the inbox's shared transactions (partitions)", func() (int64, int64) {
			s := group.Stats()
			return s.Transactions, s.Batches
		})
	}
	for part := range c.Partitions {
		var src inbox.Source
		if p.nc != nil {
			if src, err = p.natsSource(part); err != nil {
				return err
			}
		} else {
			qc, err := redisq.NewConsumer(p.rdb, &redisq.ConsumerConfig{
				Queue: chat.PartitionQueue(chat.Peer(c.Service), part), Prefix: c.RedisPrefix, Group: c.Service,
				Consumer: c.Worker.ConsumerName, LockDuration: c.LockDuration, Logger: p.log, DeadLetterMax: c.Worker.DeadLetterMax,
				OnEvent: onQueue,
			})
			if err != nil {
				return err
			}
			deleted = append(deleted, qc.DeletedPending)
			src = redisq.InboxSource(qc)
		}
		ph := h.ForPartition(part)
		var handler inbox.Handler = ph
		if c.Hooks != nil {
			src, handler = c.Hooks.Source(src), c.Hooks.Handler(handler)
		}
		var clock *tracing.FetchClock
		if p.tracer.Enabled() {
			clock = tracing.NewFetchClock(src)
			src = clock
		}
		// When the inbox transaction enqueued a receipt in this service's
		// outbox of the partition (a shared transaction enqueues one, in
		// its first batch's partition), wake the partition's relay at most
		// once per receiptWakeDelay, so that under load one relay pass
		// carries the receipts of many inbox batches: directly when it runs
		// in this process, else by a NOTIFY on its channel.
		var wakePending atomic.Bool
		afterCommit := func(applied []inbox.Applied) {
			observeE2E(applied)
			if clock != nil {
				tracing.Applied(p.tracer, clock, applied)
			}
			if gw != nil {
				gw.OfferApplied(applied)
			}
			waker.Committed(applied)
			if ph.TakeReceiptQueued() && wakePending.CompareAndSwap(false, true) {
				time.AfterFunc(receiptWakeDelay, func() {
					wakePending.Store(false)
					if wake := p.relayWake; wake != nil && wake(part) {
						return
					}
					// The partition's relay runs in another process (no relay
					// role here, or its lease is elsewhere): NOTIFY it.
					waker.WakeRelay(chat.PartitionOutboxChannel(c.Service, part))
				})
			}
		}
		ic, err := inbox.NewConsumer(p.pool, src, handler, &inbox.Config{
			Logger: p.log, OnEvent: onInbox, AfterCommit: afterCommit, Group: group,
		})
		if err != nil {
			return err
		}
		consumers = append(consumers, ic)
	}
	p.m.DeletedPending(func() (n int64) {
		for _, f := range deleted {
			n += f()
		}
		return n
	})
	held, err := receive.NewHeldChanges(p.pool, c.Service, 0, p.log)
	if err != nil {
		return err
	}
	// The waker is started before the consumers and stopped after them, so
	// that the last batch's wake-up is sent.
	p.add(waker)
	p.add(consumers...)
	p.add(held)
	p.announce = append(p.announce, func() {
		p.log.Info("worker started", "queue", chat.QueueName(chat.Peer(c.Service)), "consumer", c.Worker.ConsumerName,
			"partitions", c.Partitions)
	})
	return nil
}

// publisherConfig is the config of the publisher to partition part's
// stream of the peer (the relay's and, for partition 0, the v1 dual
// writer's).
func (p *process) publisherConfig(part int) *redisq.PublisherConfig {
	c := p.cfg
	return &redisq.PublisherConfig{Queue: chat.PartitionQueue(c.Service, part), Prefix: c.RedisPrefix, Logger: p.log,
		ReplicaAcks: c.RedisReplicaAcks, Sign: p.signer()}
}

// signer signs this service's outbound events (nil without event keys):
// one key per direction, whatever the partition or the broker.
func (p *process) signer() func(redisq.Job) string {
	if p.keys == nil {
		return nil
	}
	return p.keys.Signer(chat.QueueName(p.cfg.Service))
}

// buildRelay builds the relay role: the outbox relay of each partition,
// their heartbeat and vacuums, and the re-drive. With one partition the
// relay runs as long as the process; with more, a lease manager runs the
// relays of the partitions this process holds (partitions.go).
func (p *process) buildRelay() error {
	c := p.cfg
	onRelay := p.m.RelayEvents(p.log)
	relays := make([]*outbox.Relay, c.Partitions)
	pubs := make([]receive.Republisher, c.Partitions)
	// With partitions, the passes of this process's relays share their
	// transactions (outbox.RelayGroup): one send group wakes the relays
	// of several partitions at once, and their passes then claim, publish
	// and delete in one transaction, as one partition's would. Not on a
	// Redis Cluster: there the partitions are spread over masters so that
	// one master's trouble (a failover, a slot move) holds back only its
	// own lanes, and a shared pass would wait for its slowest add.
	var group *outbox.RelayGroup
	if _, cluster := p.rdb.(*redis.ClusterClient); c.Partitions > 1 && !cluster {
		var err error
		if group, err = outbox.NewRelayGroup(p.pool); err != nil {
			return err
		}
		p.m.SharedWork("outboxchat_relay_shared", "passes", "the relays' shared passes (partitions)", func() (int64, int64) {
			s := group.Stats()
			return s.Transactions, s.Passes
		})
	}
	for part := range c.Partitions {
		var op outbox.Publisher
		if p.nc != nil {
			q, err := p.natsQueue(c.Service, part, p.signer())
			if err != nil {
				return err
			}
			op, pubs[part] = natsq.OutboxPublisher(q), natsRepublisher{q}
		} else {
			pub, err := redisq.NewPublisher(p.rdb, p.publisherConfig(part))
			if err != nil {
				return err
			}
			op, pubs[part] = redisq.OutboxPublisher(pub), pub
		}
		op = p.fence.Publisher(op)
		if c.Hooks != nil {
			op = c.Hooks.Publisher(op)
		}
		if p.tracer.Enabled() {
			op = tracing.Publisher(op, p.tracer)
		}
		rlog := p.log
		if c.Partitions > 1 {
			rlog = rlog.With("partition", part)
		}
		var err error
		relays[part], err = outbox.NewRelay(p.pool, &outbox.RelayConfig{
			Table: chat.OutboxTable(c.Service, part), Channel: chat.PartitionOutboxChannel(c.Service, part), Publisher: op,
			PollInterval: c.Relay.PollInterval, Linger: c.Relay.linger(), DisableListen: c.Relay.PollOnly, Logger: rlog,
			OnEvent: onRelay, Notifier: p.listener, MaxAttempts: c.Relay.MaxAttempts,
			// This process's sends wake the relay directly; their NOTIFYs (for
			// other processes) would only cause a second pass here.
			SkipOwnNotifications: c.directRelayWake(),
			Group:                group,
		})
		if err != nil {
			return err
		}
	}
	pr := &partitionRelays{relays: relays}
	var listening func() bool
	if !c.Relay.PollOnly {
		listening = pr.listening
	}
	if c.Partitions == 1 {
		p.add(relays[0])
	} else {
		lm, err := p.leaseManager(pr)
		if err != nil {
			return err
		}
		p.add(lm)
	}
	p.add(heartbeat.New(p.pool, c.Service, c.Worker.ConsumerName, pr.lastPass, listening, p.log))
	if c.Relay.OutboxVacuumRows >= 0 {
		for part := range c.Partitions {
			vac, err := outbox.NewVacuum(p.pool, &outbox.VacuumConfig{
				Table: chat.OutboxTable(c.Service, part), DeadRows: c.Relay.OutboxVacuumRows, Logger: p.log,
			})
			if err != nil {
				return err
			}
			p.add(vac)
		}
	}
	if keep := c.Relay.HistoryRetention; keep > 0 {
		p.add(retention.New(p.pool, c.Service, keep, p.m.Pruned(), p.log))
	}
	if after := c.Relay.RedriveAfter; after > 0 {
		rcfg := &receive.RedriveConfig{After: after, Logger: p.log, Redriven: p.m.Redriven()}
		if c.Partitions > 1 {
			rcfg.Partitions = pubs
		}
		rd, err := receive.NewRedriver(p.pool, c.Service, pubs[0], rcfg)
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
		p.relayWake, p.relayWakeChats = pr.wake, pr.wakeChats
	}
	p.announce = append(p.announce, func() {
		p.log.Info("relay started", "queue", chat.QueueName(c.Service), "poll_only", c.Relay.PollOnly, "partitions", c.Partitions)
	})
	return nil
}

// pushTracer is the gateway's OnPush: nil when tracing is off.
func (p *process) pushTracer() func(chat.Message, time.Time) {
	if !p.tracer.Enabled() {
		return nil
	}
	return tracing.Push(p.tracer)
}
