// Package groupcommit runs the work that callers bring while a run is in
// flight together, in the next run: the pattern of a database's group
// commit, for the inbox's shared transactions (inbox.Group) and the relay's
// shared passes (outbox.RelayGroup).
//
// A caller that finds the Queue idle runs at once (with whatever else is
// waiting by then), so an idle Queue adds no wait. While a run is in
// flight, later callers wait; when it ends, the first of them leads the
// next run, which carries every item waiting by then. There is no
// goroutine of the Queue's own: the lead passes from caller to caller.
//
// A run gets its items in the order of their ranks (Join), not of their
// arrival: two processes whose members joined in the same order (one per
// partition, in partition order) then take their locks in the same order,
// and their runs cannot deadlock one another.
package groupcommit

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"sync/atomic"
)

// Queue coalesces items of type T (typically a pointer to a request that
// carries its own outcome) into runs. The zero Queue is ready for use; a
// Queue must not be copied after first use. Safe for concurrent use.
type Queue[T any] struct {
	mu      sync.Mutex
	busy    bool        // a caller is running a run
	waiting []*entry[T] // items for the next run, in arrival order
	members atomic.Int64
}

type entry[T any] struct {
	rank int64
	item T
	ch   chan bool // buffered: true hands the lead, false says the item ran
}

// Join returns a new member's rank, 1, 2, …: what it passes to Do. Safe
// for concurrent use.
func (q *Queue[T]) Join() int64 { return q.members.Add(1) }

// Do runs item, of the member of rank rank (Join), in the next run and
// returns once that run is over: nil, and the run has done with item what
// run does (run gets the items of a run in rank order, arrival order among
// equal ranks, item among them, and ctx of the caller that leads it).
// When ctx ends while item still waits, Do takes it out of the Queue and
// returns ctx.Err() without running it; once a run has taken it, Do waits
// for that run (whose own ctx bounds it) and returns nil.
func (q *Queue[T]) Do(ctx context.Context, rank int64, item T, run func(ctx context.Context, items []T)) error {
	e := &entry[T]{rank: rank, item: item, ch: make(chan bool, 1)}
	q.mu.Lock()
	q.waiting = append(q.waiting, e)
	if q.busy {
		q.mu.Unlock()
		select {
		case lead := <-e.ch:
			if !lead {
				return nil
			}
		case <-ctx.Done():
			return q.abandon(e, ctx.Err())
		}
		q.mu.Lock()
	}
	q.busy = true
	round := q.waiting
	q.waiting = nil
	q.mu.Unlock()

	sorted := slices.SortedStableFunc(slices.Values(round), func(a, b *entry[T]) int { return cmp.Compare(a.rank, b.rank) })
	items := make([]T, len(sorted))
	for i, o := range sorted {
		items[i] = o.item
	}
	run(ctx, items)
	for _, o := range round {
		if o != e {
			o.ch <- false
		}
	}
	q.mu.Lock()
	q.handOff()
	q.mu.Unlock()
	return nil
}

// Waiting returns the number of items waiting for the next run.
func (q *Queue[T]) Waiting() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.waiting)
}

// handOff gives the lead to the first waiting caller, or leaves the Queue
// idle. Called with mu held.
func (q *Queue[T]) handOff() {
	if len(q.waiting) == 0 {
		q.busy = false
		return
	}
	q.waiting[0].ch <- true
}

// abandon takes e out of the Queue after its caller's ctx ended while it
// waited: out of the queue (passing on the lead if it had just been handed
// it), or, when a run already carries it, after that run.
func (q *Queue[T]) abandon(e *entry[T], cause error) error {
	q.mu.Lock()
	if i := slices.Index(q.waiting, e); i >= 0 {
		q.waiting = slices.Delete(q.waiting, i, i+1)
		select {
		case <-e.ch: // the lead, sent while e was first in the queue
			q.handOff()
		default:
		}
		q.mu.Unlock()
		return cause
	}
	q.mu.Unlock()
	<-e.ch
	return nil
}
