// Package streamgroup is the read side of one member of a Redis stream's
// consumer group: which entries it hands out next (its own pending ones,
// then entries stalled on any member, then new ones), the group's creation
// and re-creation, and the bookkeeping of what it handed out and was not
// settled. It decodes nothing: an entry is its id, its fields and its
// delivery count.
package streamgroup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// maxClaimRounds bounds the XAUTOCLAIM calls one Read makes while scanning
// a long pending list for stalled entries (each call scans up to 10×max).
const maxClaimRounds = 4

// Config is what a Reader reads and how. Every field is required except the
// callbacks.
type Config struct {
	// Stream is the stream's key; Group the consumer group; Consumer this
	// member's name in it.
	Stream, Group, Consumer string
	// Block is the longest one Read waits for new entries (XREADGROUP
	// BLOCK, millisecond resolution).
	Block time.Duration
	// LockDuration is how long an entry stays pending before Read takes it
	// over (XAUTOCLAIM min-idle); ClaimInterval the least time between two
	// scans for such entries.
	LockDuration, ClaimInterval time.Duration
	// Logger receives the debug line of a failed delivery-count lookup.
	Logger *slog.Logger
	// OnReclaimed is called with the n > 0 stalled entries one Read took
	// over, before it returns them. nil: not told.
	OnReclaimed func(ctx context.Context, n int)
	// OnDeleted is called with the ids of pending entries found deleted
	// from the stream, after they were acknowledged away. nil: not told.
	OnDeleted func(ctx context.Context, ids []string)
	// OnGroupLost is called with Redis's NOGROUP reply when the group
	// vanished; the next Read creates it again. nil: not told.
	OnGroupLost func(ctx context.Context, err error)
}

// Entry is one stream entry handed out by Read.
type Entry struct {
	// ID is the entry's stream id ("1700000000000-0").
	ID string
	// Values are its fields as go-redis read them (strings for XADD's).
	Values map[string]any
	// Deliveries is how often Redis handed it out: 1 for a new entry, the
	// XPENDING count for one handed out again when that could be read,
	// else 1.
	Deliveries int64
}

// Reader is one member of a consumer group reading a stream. Read must be
// called by one goroutine at a time (it keeps a cursor); Settled and
// NoteNoGroup are safe to call concurrently with it and with each other.
// It runs no goroutines.
type Reader struct {
	rdb redis.UniversalClient
	cfg Config

	mu sync.Mutex // guards the fields below
	// groupReady is set once XGROUP CREATE succeeded or found the group.
	groupReady bool
	// drained is set once this member's own pending list has been read
	// through (from cursor) without finding anything.
	drained bool
	// cursor is the last own-pending id returned while draining.
	cursor string
	// outstanding holds the ids handed out by Read and not yet settled.
	outstanding map[string]struct{}
	// claimCursor is where the next XAUTOCLAIM scan continues ("0-0": start).
	claimCursor string
	// lastClaim is when the last complete XAUTOCLAIM scan ended.
	lastClaim time.Time
}

// New returns the Reader of cfg through rdb. It does not touch Redis: the
// group is created by the first Read.
func New(rdb redis.UniversalClient, cfg Config) *Reader {
	return &Reader{rdb: rdb, cfg: cfg, cursor: "0", outstanding: map[string]struct{}{}, claimCursor: "0-0"}
}

// Read returns up to max (≥ 1) entries: this member's own pending ones
// (left by an earlier run under its name, or handed out by an earlier Read
// and not settled since), else entries pending on any member for longer
// than LockDuration (taken over; scanned at most every ClaimInterval),
// else new ones, waiting up to Block (cut to end 50 ms before ctx's
// deadline). Nothing and no error when none came. It creates the group at
// "0" with MKSTREAM first if needed, and again once after a NOGROUP reply
// (OnGroupLost). Pending entries deleted from the stream are acknowledged
// away (OnDeleted) and not returned. Errors are Redis's, wrapped; after one
// the own pending list is read again from its start.
func (r *Reader) Read(ctx context.Context, max int) ([]Entry, error) {
	es, err := r.read(ctx, max)
	if r.NoteNoGroup(ctx, err) {
		es, err = r.read(ctx, max)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		// Entries may have been delivered without reaching the caller:
		// look at the pending list again next time.
		r.drained = false
		r.cursor = "0"
		return nil, err
	}
	for _, e := range es {
		r.outstanding[e.ID] = struct{}{}
	}
	return es, nil
}

// Settled forgets ids (acknowledged or dead-lettered): a later Read no
// longer hands them out again first.
func (r *Reader) Settled(ids ...string) {
	r.mu.Lock()
	for _, id := range ids {
		delete(r.outstanding, id)
	}
	r.mu.Unlock()
}

// NoteNoGroup reports whether err is Redis's NOGROUP reply (the stream or
// its group vanished: FLUSHALL, a restart without the AOF, a failover to a
// replica that lacked them); then it calls OnGroupLost and makes the next
// Read create the group again, at "0" (never "$": entries already in the
// stream are delivered).
func (r *Reader) NoteNoGroup(ctx context.Context, err error) bool {
	if !redis.HasErrorPrefix(err, "NOGROUP") {
		return false
	}
	r.mu.Lock()
	r.groupReady = false
	r.mu.Unlock()
	if r.cfg.OnGroupLost != nil {
		r.cfg.OnGroupLost(ctx, err)
	}
	return true
}

func (r *Reader) read(ctx context.Context, max int) ([]Entry, error) {
	if err := r.ensureGroup(ctx); err != nil {
		return nil, err
	}
	es, err := r.readOwnPending(ctx, max)
	if err != nil || len(es) > 0 {
		return es, err
	}
	es, err = r.readStalled(ctx, max)
	if err != nil || len(es) > 0 {
		return es, err
	}
	return r.readNew(ctx, max)
}

func (r *Reader) ensureGroup(ctx context.Context) error {
	r.mu.Lock()
	ready := r.groupReady
	r.mu.Unlock()
	if ready {
		return nil
	}
	err := r.rdb.XGroupCreateMkStream(ctx, r.cfg.Stream, r.cfg.Group, "0").Err()
	if err != nil && !redis.HasErrorPrefix(err, "BUSYGROUP") {
		return fmt.Errorf("creating consumer group: %w", err)
	}
	r.mu.Lock()
	r.groupReady = true
	// A new group (or a first Read) starts with a fresh look at the
	// pending list.
	r.drained = false
	r.cursor = "0"
	r.mu.Unlock()
	return nil
}

// readOwnPending reads this member's pending list from the cursor.
func (r *Reader) readOwnPending(ctx context.Context, max int) ([]Entry, error) {
	r.mu.Lock()
	if len(r.outstanding) > 0 {
		// Entries handed out and not settled: read the list again from
		// the start, so they are retried before anything new.
		clear(r.outstanding)
		r.drained = false
		r.cursor = "0"
	}
	drained, cursor := r.drained, r.cursor
	r.mu.Unlock()
	for !drained {
		msgs, err := r.readGroup(ctx, cursor, max, -1)
		if err != nil {
			return nil, err
		}
		if len(msgs) == 0 {
			r.mu.Lock()
			r.drained = true
			r.mu.Unlock()
			return nil, nil
		}
		cursor = msgs[len(msgs)-1].ID
		r.mu.Lock()
		r.cursor = cursor
		r.mu.Unlock()
		live, err := r.dropDeleted(ctx, msgs, nil)
		if err != nil {
			return nil, err
		}
		if len(live) > 0 {
			return r.entries(ctx, live, true), nil
		}
	}
	return nil, nil
}

// readStalled takes over entries idle for longer than LockDuration.
func (r *Reader) readStalled(ctx context.Context, max int) ([]Entry, error) {
	r.mu.Lock()
	// An unfinished scan continues at once; a new one waits ClaimInterval.
	due := r.claimCursor != "0-0" || time.Since(r.lastClaim) >= r.cfg.ClaimInterval
	start := r.claimCursor
	r.mu.Unlock()
	if !due {
		return nil, nil
	}
	for round := 0; round < maxClaimRounds; round++ {
		msgs, next, deleted, err := r.rdb.XAutoClaimWithDeleted(ctx, &redis.XAutoClaimArgs{
			Stream:   r.cfg.Stream,
			Group:    r.cfg.Group,
			Consumer: r.cfg.Consumer,
			MinIdle:  r.cfg.LockDuration,
			Start:    start,
			Count:    int64(max),
		}).Result()
		if err != nil {
			return nil, fmt.Errorf("reclaiming stalled entries: %w", err)
		}
		r.mu.Lock()
		r.claimCursor = next
		if next == "0-0" {
			r.lastClaim = time.Now()
		}
		r.mu.Unlock()
		live, err := r.dropDeleted(ctx, msgs, deleted)
		if err != nil {
			return nil, err
		}
		if len(live) > 0 {
			if r.cfg.OnReclaimed != nil {
				r.cfg.OnReclaimed(ctx, len(live))
			}
			return r.entries(ctx, live, true), nil
		}
		if next == "0-0" {
			break
		}
		start = next
	}
	return nil, nil
}

// readNew waits up to Block for entries never delivered to the group.
func (r *Reader) readNew(ctx context.Context, max int) ([]Entry, error) {
	block := r.cfg.Block
	if deadline, ok := ctx.Deadline(); ok {
		// Leave room for the reply, so a short ctx deadline ends the
		// block cleanly instead of timing out the connection.
		left := time.Until(deadline) - 50*time.Millisecond
		if left < time.Millisecond {
			return nil, nil
		}
		block = min(block, left)
	}
	msgs, err := r.readGroup(ctx, ">", max, block)
	if err != nil {
		return nil, err
	}
	return r.entries(ctx, msgs, false), nil
}

// readGroup runs XREADGROUP from id; block < 0 omits BLOCK. A timed-out
// block yields no messages and no error.
func (r *Reader) readGroup(ctx context.Context, id string, max int, block time.Duration) ([]redis.XMessage, error) {
	streams, err := r.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group:    r.cfg.Group,
		Consumer: r.cfg.Consumer,
		Streams:  []string{r.cfg.Stream, id},
		Count:    int64(max),
		Block:    block,
	}).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading group from %s: %w", id, err)
	}
	if len(streams) == 0 {
		return nil, nil
	}
	return streams[0].Messages, nil
}

// dropDeleted acknowledges entries that are pending but no longer in the
// stream (nil fields, or listed by XAUTOCLAIM as deleted: Redis 7's third
// reply element), tells OnDeleted, and returns the others.
func (r *Reader) dropDeleted(ctx context.Context, msgs []redis.XMessage, deleted []string) ([]redis.XMessage, error) {
	live := msgs[:0:0]
	gone := append([]string(nil), deleted...)
	for _, m := range msgs {
		if m.Values == nil {
			gone = append(gone, m.ID)
			continue
		}
		live = append(live, m)
	}
	if len(gone) > 0 {
		if err := r.rdb.XAck(ctx, r.cfg.Stream, r.cfg.Group, gone...).Err(); err != nil {
			return nil, fmt.Errorf("acknowledging deleted entries: %w", err)
		}
		if r.cfg.OnDeleted != nil {
			r.cfg.OnDeleted(ctx, gone)
		}
	}
	return live, nil
}

// entries converts msgs. For redelivered entries it looks up the delivery
// counts (XPENDING); if that fails they are left at 1.
func (r *Reader) entries(ctx context.Context, msgs []redis.XMessage, redelivered bool) []Entry {
	if len(msgs) == 0 {
		return nil
	}
	es := make([]Entry, len(msgs))
	for i, m := range msgs {
		es[i] = Entry{ID: m.ID, Values: m.Values, Deliveries: 1}
	}
	if !redelivered {
		return es
	}
	pending, err := r.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{
		Stream:   r.cfg.Stream,
		Group:    r.cfg.Group,
		Consumer: r.cfg.Consumer,
		Start:    msgs[0].ID,
		End:      msgs[len(msgs)-1].ID,
		Count:    int64(len(msgs)) + 1000,
	}).Result()
	if err != nil {
		r.cfg.Logger.DebugContext(ctx, "could not read delivery counts", "err", err)
		return es
	}
	counts := make(map[string]int64, len(pending))
	for _, p := range pending {
		counts[p.ID] = p.RetryCount
	}
	for i := range es {
		if n, ok := counts[es[i].ID]; ok {
			es[i].Deliveries = n
		}
	}
	return es
}
