package inbox

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/internal/groupcommit"
)

// Group lets several Consumers share their inbox transactions, as a
// database's group commit shares its WAL flushes: while one member's
// transaction is in flight, the batches the other members bring wait, and
// the next transaction carries all of them, each member's statements in
// turn. A program that reads several queues (one per partition, say) then
// pays one transaction, one round trip and one commit flush for the
// batches that arrive together instead of one each. A member that finds no
// transaction in flight commits at once: the Group adds no wait when idle.
//
// Only members whose Handler is a PipelineHandler share transactions; the
// others commit their own. Each member keeps its own order and its own
// batch: a batch is acknowledged, dead-lettered and handed to AfterCommit by
// its own Consumer, after the shared commit. When a shared transaction
// fails (one member's poison statement aborts it, Postgres went away), every
// member of it runs its batch again in a transaction of its own, so that a
// failure is classified and isolated for the batch that caused it, and the
// others are applied (a statement that failed after the COMMIT ran leaves
// duplicates for that retry, which the inbox skips: at least once holds).
//
// The price is that a batch waits for the transaction in flight: a slow
// one (a lock wait, a slow commit) holds back the batches of the other
// members as long, where without the Group only its own would wait.
//
// When every member's handler is a MergeHandler, the Group has the first
// one queue all of the members' batches at once (MergeHandler.QueueMerged),
// so that they can share statements, not only the transaction.
//
// A shared transaction runs its members' statements in the order the
// members joined the Group (their NewConsumer calls), whatever order their
// batches came in: processes that create their members in the same order
// take their locks in the same order, and their shared transactions do not
// deadlock one another.
//
// Create it with NewGroup and give it to each member in Config.Group. It
// holds no goroutine of its own: the member that finds the Group idle runs
// the transaction, and hands the lead to the first waiting member when
// done. Safe for concurrent use.
type Group struct {
	pool *pgxpool.Pool
	q    groupcommit.Queue[*groupReq]

	txs, batches atomic.Int64
}

// GroupStats are cumulative counters of a Group.
type GroupStats struct {
	// Transactions is the number of transactions the Group ran (committed
	// or not).
	Transactions int64
	// Batches is the number of member batches those transactions carried;
	// Batches / Transactions is how many batches shared one.
	Batches int64
}

// NewGroup returns a Group whose transactions run on pool, which must be
// the pool of every member Consumer (NewConsumer refuses another).
// It does not touch the network. Error: a nil pool (wrapping
// ErrInvalidConfig).
func NewGroup(pool *pgxpool.Pool) (*Group, error) {
	if pool == nil {
		return nil, fmt.Errorf("creating inbox group: nil pool: %w", ErrInvalidConfig)
	}
	return &Group{pool: pool}, nil
}

// Stats returns the cumulative counters. Safe for concurrent use.
func (g *Group) Stats() GroupStats {
	return GroupStats{Transactions: g.txs.Load(), Batches: g.batches.Load()}
}

// groupReq is one member's batch in a Group: what to queue, where its
// results go, and its outcome.
type groupReq struct {
	ph  PipelineHandler
	ds  []Delivery
	rs  []BatchResult
	err error // set by the transaction that carried it
}

// errShared marks the failure of a shared transaction: the member runs its
// batch again alone (Consumer.applyPipelined).
var errShared = errors.New("inbox: shared transaction failed")

// commit runs r in the next shared transaction and returns its outcome:
// nil once committed (r.rs filled), an error wrapping errShared when the
// shared transaction failed, r's own error (its QueueBatch's, or a failure
// of a transaction that carried r alone), or ctx.Err() when ctx ended while
// r waited. ctx bounds the wait and, when r's member leads, the
// transaction.
func (g *Group) commit(ctx context.Context, rank int64, r *groupReq) error {
	if err := g.q.Do(ctx, rank, r, g.run); err != nil {
		return err
	}
	return r.err
}

// run runs one shared transaction for round (in the order the members
// joined: groupcommit) and sets each member's err.
func (g *Group) run(ctx context.Context, round []*groupReq) {
	b := &pgx.Batch{}
	queued := g.queueMerged(b, round)
	if queued == nil {
		queued = make([]*groupReq, 0, len(round))
		for _, r := range round {
			sub := &pgx.Batch{}
			if err := r.ph.QueueBatch(sub, r.ds, r.rs); err != nil {
				r.err = fmt.Errorf("queueing batch of %d deliveries: %w", len(r.ds), err)
				continue
			}
			b.QueuedQueries = append(b.QueuedQueries, sub.QueuedQueries...)
			queued = append(queued, r)
		}
	}
	if len(queued) == 0 {
		return
	}
	g.txs.Add(1)
	g.batches.Add(int64(len(queued)))
	err := commitPipelined(ctx, g.pool, b)
	if err != nil && len(queued) > 1 {
		err = fmt.Errorf("%w (%d batches): %w", errShared, len(queued), err)
	}
	for _, r := range queued {
		r.err = err
	}
}

// queueMerged queues round on b through the first member's MergeHandler
// when every member's handler is one, and returns round; nil when it did
// not (b untouched). A QueueMerged error fails the round as a shared
// transaction would, so that each member runs its batch alone.
func (g *Group) queueMerged(b *pgx.Batch, round []*groupReq) []*groupReq {
	if len(round) < 2 {
		return nil
	}
	hs := make([]PipelineHandler, len(round))
	ds := make([][]Delivery, len(round))
	rs := make([][]BatchResult, len(round))
	for i, r := range round {
		if _, ok := r.ph.(MergeHandler); !ok {
			return nil
		}
		hs[i], ds[i], rs[i] = r.ph, r.ds, r.rs
	}
	sub := &pgx.Batch{}
	err := round[0].ph.(MergeHandler).QueueMerged(sub, hs, ds, rs)
	if err != nil {
		for _, r := range round {
			clear(r.rs)
			r.err = fmt.Errorf("%w: merging %d batches: %w", errShared, len(round), err)
		}
		return []*groupReq{}
	}
	b.QueuedQueries = append(b.QueuedQueries, sub.QueuedQueries...)
	return round
}
