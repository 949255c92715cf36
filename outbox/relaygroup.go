package outbox

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/internal/groupcommit"
	"github.com/outboxchat/outboxchat/outbox/internal/outboxsql"
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
// UPDATE, in id order, from its own claim floor; internal/claimfloor), its rows go to
// its own Publisher (the members' Publish calls run concurrently), and its
// own published rows are deleted. The members share the sequence read (one
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

// passReq is one member's pass in a shared one, and its outcome.
type passReq struct {
	r   *Relay
	t   WakeTrigger
	p   pass
	err error

	floor   int64
	wantXid bool
	h       horizon
	c       claim
	pub     published
	m       marked
}

// pass runs r's pass in the next shared pass and returns its outcome, or
// ctx.Err() when ctx ended while it waited.
func (g *RelayGroup) pass(ctx context.Context, r *Relay, t WakeTrigger) (pass, error) {
	req := &passReq{r: r, t: t}
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
	start := time.Now()
	lead := reqs[0].r
	failAll := func(stage string, err error) {
		for _, q := range reqs {
			q.p, q.err = pass{}, q.r.fail(stage, err)
		}
	}
	conn, err := g.pool.Acquire(ctx)
	if err != nil {
		failAll("claim", fmt.Errorf("outbox: relay: claim: acquire connection: %w", err))
		return
	}
	defer conn.Release() // destroys the connection if a transaction is left open
	inTx := false
	defer rollbackOpen(ctx, conn, &inTx)

	// The sequence reads before BEGIN, so before the xid: internal/claimfloor.
	b := &pgx.Batch{}
	tables := make([]string, len(reqs))
	for i, q := range reqs {
		q.floor, q.wantXid = q.r.floor.Start(start)
		tables[i] = q.r.table
	}
	b.Queue(outboxsql.Seqs, tables)
	b.Queue("BEGIN")
	b.Queue(outboxsql.Snapshot)
	b.Queue(outboxsql.SetTimeouts, lead.timeouts[0], lead.timeouts[1], lead.timeouts[2])
	for _, q := range reqs {
		b.Queue(q.r.sql.Claim, q.r.batchSize, q.floor)
	}
	br := conn.SendBatch(ctx, b)
	inTx = true
	err = readSharedClaim(br, reqs)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		failAll("claim", fmt.Errorf("outbox: relay: claim: %w", err))
		return
	}

	// Every member publishes its own rows, side by side.
	var wg sync.WaitGroup
	rows, wantXid := false, false
	for _, q := range reqs {
		q.pub.k = -1
		if len(q.c.msgs) == 0 {
			continue
		}
		rows = true
		q.r.event(RelayEvent{Kind: EventClaimed, N: len(q.c.msgs), Trigger: q.t})
		wg.Go(func() { q.pub = q.r.publish(ctx, q.c.msgs) })
	}
	wg.Wait()

	b = &pgx.Batch{}
	for _, q := range reqs {
		switch {
		case len(q.c.msgs) == 0:
		case q.pub.err != nil:
			// Its rows stay unsent; the failure is recorded on them here,
			// where they are still locked.
			b.Queue(q.r.sql.Record, q.c.ids, lastError(q.pub.err))
		default:
			q.c.blame(q.pub)
			q.r.queueMark(b, q.c, q.pub)
			wantXid = wantXid || q.wantXid
		}
	}
	if wantXid {
		// The xid the claims' row locks gave this transaction, after the
		// sequence reads: the floors' R (internal/claimfloor).
		b.Queue(outboxsql.Xid)
	}
	b.Queue("COMMIT")
	br = conn.SendBatch(ctx, b)
	var xid int64
	err = readSharedMark(br, reqs, wantXid, &xid)
	if err == nil {
		err = readCommit(br)
	}
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		stage := "mark_sent"
		if !rows {
			stage = "claim"
		}
		failAll(stage, fmt.Errorf("outbox: relay: mark rows sent (shared pass of %d tables): %w", len(reqs), err))
		// The first record rolls the transaction back (the deferred
		// rollback does when no member claimed rows).
		for _, q := range reqs {
			if len(q.c.ids) > 0 {
				q.r.rollbackAndRecord(ctx, conn, &inTx, q.c.ids, err)
			}
		}
		return
	}
	inTx = false
	for _, q := range reqs {
		switch {
		case len(q.c.msgs) == 0:
			q.p.wait = q.c.wait
			q.r.emptyPassDone(q.floor, q.h, q.c)
		case q.pub.err != nil:
			q.p, q.err = pass{}, q.r.fail("publish", q.pub.err)
		default:
			x := int64(0)
			if q.wantXid {
				x = xid
			}
			q.p = q.r.passDone(start, q.t, q.floor, q.h, x, q.c, q.pub, q.m)
		}
	}
}

// readSharedClaim reads the results of a shared pass's first round trip:
// the members' sequence reads, BEGIN, the snapshot read, set_config and
// each member's claim, into the members' horizons and claims.
func readSharedClaim(br pgx.BatchResults, reqs []*passReq) error {
	rows, err := br.Query()
	if err != nil {
		return fmt.Errorf("read sequences: %w", err)
	}
	i := 0
	for rows.Next() {
		if i < len(reqs) {
			err = rows.Scan(&reqs[i].h.v)
		}
		i++
		if err != nil {
			break
		}
	}
	rows.Close()
	if err == nil {
		err = rows.Err()
	}
	if err == nil && i != len(reqs) {
		err = fmt.Errorf("%d values for %d tables", i, len(reqs))
	}
	if err != nil {
		return fmt.Errorf("read sequences: %w", err)
	}
	var xmin int64
	if err := readTxStart(br, &xmin); err != nil {
		return err
	}
	for _, q := range reqs {
		q.h.xmin = xmin
		claimed, waits, err := readRows(br)
		if err != nil {
			return err
		}
		q.c = q.r.account(claimed, waits)
	}
	return nil
}

// readSharedMark reads the results of the members' deletions, failures and
// records, and the xid when it was read.
func readSharedMark(br pgx.BatchResults, reqs []*passReq, wantXid bool, xid *int64) error {
	for _, q := range reqs {
		switch {
		case len(q.c.msgs) == 0:
		case q.pub.err != nil:
			if _, err := br.Exec(); err != nil {
				return err
			}
		default:
			m, err := q.r.readMark(br, q.pub)
			if err != nil {
				return err
			}
			q.m = m
		}
	}
	if wantXid {
		return br.QueryRow().Scan(xid)
	}
	return nil
}
