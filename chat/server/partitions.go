package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/lease"
	"github.com/outboxchat/outboxchat/outbox"
)

// relayStopTimeout bounds the stop of one partition's relay when its lease
// goes (released, lost or expired): it finishes its pass, which its own
// statement and Redis timeouts bound already.
const relayStopTimeout = 10 * time.Second

// partitionRelays are the relays of a process, one per partition (index =
// partition). With one partition the relay runs as a service of its own;
// with more, the lease manager starts and stops them.
type partitionRelays struct {
	relays []*outbox.Relay
}

// lastPass is the latest pass committed by any of the relays (the
// heartbeat's).
func (pr *partitionRelays) lastPass() time.Time {
	var last time.Time
	for _, r := range pr.relays {
		if t := r.LastPass(); t.After(last) {
			last = t
		}
	}
	return last
}

// listening reports whether every running relay's LISTEN connection is
// up (true when none runs: no wake-up can be missed).
func (pr *partitionRelays) listening() bool {
	for _, r := range pr.relays {
		if relayRunning(r) && !r.Listening() {
			return false
		}
	}
	return true
}

// relayRunning reports whether r has started and not yet stopped.
func relayRunning(r *outbox.Relay) bool {
	select {
	case <-r.Started():
	default:
		return false
	}
	select {
	case <-r.Stopped():
		return false
	default:
		return true
	}
}

// wake wakes the relay of partition part and reports whether it runs here
// (a relay that does not is woken all the same: its next start runs a pass
// at once; the caller NOTIFYs the one that runs elsewhere).
func (pr *partitionRelays) wake(part int) bool {
	if part < 0 || part >= len(pr.relays) {
		return false
	}
	r := pr.relays[part]
	r.Wake()
	return relayRunning(r)
}

// wakeChats wakes the relays of the partitions of ms's chats, once each.
func (pr *partitionRelays) wakeChats(ms []chat.Message) {
	if len(pr.relays) == 1 {
		pr.relays[0].Wake()
		return
	}
	for _, part := range chat.PartitionsOf(ms, len(pr.relays)) {
		pr.relays[part].Wake()
	}
}

// leaseManager builds the lease manager that runs the relays of the
// partitions this process holds (package chat/lease). Its owner name is
// the consumer name plus a random suffix: two processes without the
// worker role on one host share their default name.
func (p *process) leaseManager(pr *partitionRelays) (*lease.Manager, error) {
	c := p.cfg
	var b [4]byte
	_, _ = rand.Read(b[:])
	owner := c.Worker.ConsumerName + "#" + hex.EncodeToString(b[:])
	log := p.log
	lm, err := lease.New(p.pool, &lease.Config{
		Service: c.Service, Owner: owner, Partitions: c.Partitions, TTL: c.Relay.LeaseTTL, Logger: log,
		Acquired: func(ctx context.Context, part int) {
			if err := pr.relays[part].Start(ctx); err != nil {
				log.Warn("relay of a partition did not start", "partition", part, "err", err)
				return
			}
			log.Info("relay of partition started", "partition", part, "queue", chat.PartitionQueue(c.Service, part))
		},
		Released: func(ctx context.Context, part int) {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), relayStopTimeout)
			defer cancel()
			if err := pr.relays[part].Stop(sctx); err != nil {
				log.Warn("relay of a partition stopped hard", "partition", part, "err", err)
			}
			log.Info("relay of partition stopped", "partition", part)
		},
	})
	if err != nil {
		return nil, err
	}
	p.leases = lm
	return lm, nil
}
