package outbox

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/internal/groupcommit"
	"github.com/outboxchat/outboxchat/outbox/internal/relaypass"
)

// RelayGroup lets the relays of several outbox tables (one per partition,
// say) share their passes, as a database's group commit shares its WAL
// flushes: while one member's pass is in flight, the passes other members
// start wait, and the next pass claims from all of their tables in one
// transaction. A process that relays several tables then pays one
// transaction and two round trips for the passes that start together
// instead of that for each, and holds one connection in a transaction
// instead of one per table. A member that finds no pass in flight starts
// at once: the group adds no wait when idle.
//
// A shared pass keeps every member's guarantees, because it is the
// members' passes run side by side: each table has its own claim (FOR
// UPDATE, in id order, from its own claim floor), its rows go to its own
// Publisher (the members' Publish calls run concurrently), and its own
// published rows are deleted. The members share the sequence read (one
// statement, before the transaction), the snapshot and the xid, which is
// what the claim floor needs of them. A Publish that fails fails only its
// member's pass: its rows stay unsent and get attempts+1 and last_error in
// the shared transaction, which commits the other members' rows; a failure
// of the transaction itself (claim, delete, commit) fails every member's
// pass. A row the Publisher blames (MessageError) is handled as in a pass
// of its own. The transaction's lock, statement and idle timeouts are those
// of the member that leads it; give the members the same.
//
// The price is that a member's pass waits for the pass in flight, and a
// shared pass lasts as long as its slowest Publish: group relays whose
// Publishers share their fate (one broker), not relays whose brokers fail
// apart (the masters of a Redis Cluster, say), where one broker's failover
// would then hold back all of them.
//
// A shared pass claims from its members' tables in the order the members
// joined the group (their NewRelay calls), whatever order their passes
// started in: processes that create their relays of the same tables in the
// same order take their row locks in the same order, and their shared
// passes do not deadlock one another.
//
// Create it with NewRelayGroup and give it to each member in
// RelayConfig.Group. It holds no goroutine of its own: the member whose
// pass finds the group idle runs the transaction, and hands the lead to the
// first waiting member when done. Safe for concurrent use.
type RelayGroup struct {
	pool *pgxpool.Pool
	q    groupcommit.Queue[*passReq]

	txs, passes atomic.Int64
}

// RelayGroupStats are cumulative counters of a RelayGroup.
type RelayGroupStats struct {
	// Transactions is the number of pass transactions the group ran
	// (committed or not).
	Transactions int64
	// Passes is the number of member passes those transactions carried;
	// Passes / Transactions is how many passes shared one.
	Passes int64
}

// NewRelayGroup returns a RelayGroup whose passes run on pool, which must
// be the pool of every member Relay (NewRelay refuses another). It does not
// touch the network. Error: a nil pool (wrapping ErrInvalidConfig).
func NewRelayGroup(pool *pgxpool.Pool) (*RelayGroup, error) {
	if pool == nil {
		return nil, fmt.Errorf("outbox: new relay group: nil pool: %w", ErrInvalidConfig)
	}
	return &RelayGroup{pool: pool}, nil
}

// Stats returns the cumulative counters. Safe for concurrent use.
func (g *RelayGroup) Stats() RelayGroupStats {
	return RelayGroupStats{Transactions: g.txs.Load(), Passes: g.passes.Load()}
}

// pass runs r's pass in the next shared pass and returns its outcome, or
// ctx.Err() when ctx ended while it waited.
func (g *RelayGroup) pass(ctx context.Context, r *Relay, t WakeTrigger) (pass, error) {
	req := r.newPass(t)
	if err := g.q.Do(ctx, r.rank, req, g.run); err != nil {
		return pass{}, r.fail("claim", fmt.Errorf("outbox: relay: claim: waiting for the group's pass: %w", err))
	}
	return req.p, req.err
}

// run runs one shared pass for reqs (in the order the members joined:
// groupcommit) and sets each one's outcome.
func (g *RelayGroup) run(ctx context.Context, reqs []*passReq) {
	g.txs.Add(1)
	g.passes.Add(int64(len(reqs)))
	ps := make([]*relaypass.Pass[Message], len(reqs))
	for i, q := range reqs {
		ps[i] = &q.Pass
	}
	relaypass.RunShared(ctx, g.pool, ps)
}
