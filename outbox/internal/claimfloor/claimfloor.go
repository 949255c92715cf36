// Package claimfloor keeps an outbox relay's claim floor: the id a pass's
// claim starts at.
//
// A claim must not walk the index from its start (package outbox's doc says
// why: dead entries that a held snapshot keeps from vacuum, such as a
// forgotten transaction's, a long report's or a replica's
// hot_standby_feedback). So the relay remembers a floor, an id below
// which every row is known to be published or never to become visible,
// and claims "id >= floor".
//
// Ids are taken from the identity sequence before commit, so transactions
// commit out of id order: a row with a lower id may become visible after
// higher ones were published, and the floor must not pass it. The floor
// moves only past ids whose transactions are known to be over:
//
//  1. Before its transaction, a pass reads the sequence's last value V
//     (pg_sequence_last_value); a pass that claims rows is then given an
//     xid R by its row locks, and reads it (pg_current_xact_id) with its
//     DELETE. Every transaction that took an id ≤ V had its xid before it
//     took the id (the Writer's INSERT assigns the xid first), so before V
//     was read, so before R was assigned: its xid is < R.
//  2. A later pass whose snapshot's xmin is ≥ R knows all those
//     transactions have ended: every row with id ≤ V is visible to its
//     claim, or deleted, or rolled back. Its claim reads from the floor in
//     id order; once it commits, every row in [floor, min(V, last claimed
//     id)] is published (min(V) when the claim was not full), so the floor
//     moves just past that.
//
// R must be an xid the pass was given, not its snapshot's xmax: xmax is one
// past the latest *completed* xid, and a transaction given an xid at or
// above it may be running, invisible in the snapshot's xip list; xmin then
// equals xmax while it runs, and a floor keyed on xmax would pass its row
// (which would then wait for the full scan below, up to 10 s). Only passes
// that claimed rows start a pair: they have an xid anyway, so the floor
// costs no transaction id of its own.
//
// The floor is a hint, not state the invariants rest on: it lives in
// memory, starts at 0 (a full scan) when a Relay is created, and a full
// scan is made again every RescanEvery as a safety net, logging any
// row it finds below the floor (that would mean a writer broke the
// assumptions: ids inserted explicitly, a sequence with CACHE > 1, or an
// INSERT that took an id before its xid). A transaction holding an xid for
// long (not a read-only snapshot: those hold back vacuum, not xmin of
// snapshots) stops the floor from moving, and claims then scan from where
// it stopped: slower, still correct.
package claimfloor

import (
	"sync"
	"time"
)

// RescanEvery is how often a pass claims from id 0 regardless of the
// floor (a safety net; costs one scan over the not yet vacuumed entries).
const RescanEvery = 10 * time.Second

// Floor is one outbox table's floor state, for one relay. The zero value
// is a floor at 0 whose first Start asks for a full scan. Safe for
// concurrent use.
type Floor struct {
	mu       sync.Mutex
	floor    int64     // rows with id < floor are published or never visible
	pending  bool      // a (pendV, pendX) pair awaits a pass with xmin ≥ pendX
	pendV    int64     // sequence last value read before …
	pendX    int64     // … a pass was given this xid
	rescanAt time.Time // when the next full scan is due
}

// Start returns the id the pass's claim starts at (0 for a full scan, made
// every RescanEvery by now), and whether the pass should read its xid for
// a new (V, R) pair (when it claims rows).
func (f *Floor) Start(now time.Time) (from int64, wantXid bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !now.Before(f.rescanAt) {
		f.rescanAt = now.Add(RescanEvery)
		return 0, !f.pending
	}
	return f.floor, !f.pending
}

// Advance records a committed pass that claimed from start (what Start
// returned): v and xmin as read before its claim (v −1 when unknown), xid
// its xid, given after it read v (0 when it claimed nothing or did not
// read it), full whether its claim was cut at the batch size (or short of
// a waiting row), lastID the last id it accounts for (0 for none). It
// returns the floor before the call.
func (f *Floor) Advance(start, v, xmin, xid int64, full bool, lastID int64) (old int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	old = f.floor
	if f.pending && xmin >= f.pendX {
		bound := f.pendV
		if full {
			bound = min(bound, lastID)
		}
		if bound >= start-1 {
			f.floor = max(f.floor, bound+1)
		}
		f.pending = false
	}
	if !f.pending && v >= 0 && xid > 0 {
		f.pending, f.pendV, f.pendX = true, v, xid
	}
	return old
}
