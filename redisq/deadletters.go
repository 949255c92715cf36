package redisq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/internal/deadletter"
)

// DeadLetter is one entry of a queue's dead-letter stream (written by
// Consumer.DeadLetter).
type DeadLetter struct {
	// DeadID is the entry's id in the dead-letter stream: what Replay and
	// Drop take.
	DeadID string
	// Job is the entry's id, name, payload, sig and headers fields (empty
	// when the entry lacked them: a malformed entry can only be dropped;
	// Headers nil when its headers field did not decode).
	Job
	// Reason is why it was dead-lettered; StreamID its id in the queue
	// stream when it was.
	Reason, StreamID string
	// At is when it was dead-lettered (from DeadID's milliseconds, the
	// Redis clock).
	At time.Time
}

// DeadLetters reads and mends one queue's dead-letter stream: List, Get,
// Replay, Drop and Len. Every call is one Redis round trip (Replay one per
// entry, each atomic in a script), so each is safe to repeat and safe for
// concurrent use. Build it with NewDeadLetters.
type DeadLetters struct {
	s      deadletter.Stream
	queue  string
	ttlMS  int64
	logger *slog.Logger
}

// NewDeadLetters returns the dead-letter tools of queue under prefix (as in
// PublisherConfig) through rdb; dedupeTTL is the publisher's DedupeTTL (0 =
// DefaultDedupeTTL), which a replayed job's dedupe mark gets. Replay and
// Drop log each entry they change at Info with component=redisq (logger
// nil = slog.Default()). Errors wrap ErrInvalidConfig: nil rdb, empty or
// bad queue name.
func NewDeadLetters(rdb redis.UniversalClient, prefix, queue string, dedupeTTL time.Duration, logger *slog.Logger) (*DeadLetters, error) {
	if rdb == nil {
		return nil, fmt.Errorf("redisq: dead letters: nil redis client: %w", ErrInvalidConfig)
	}
	if queue == "" {
		return nil, fmt.Errorf("redisq: dead letters: queue is required: %w", ErrInvalidConfig)
	}
	if err := checkQueueName(queue); err != nil {
		return nil, fmt.Errorf("redisq: dead letters: %w", err)
	}
	if dedupeTTL <= 0 {
		dedupeTTL = DefaultDedupeTTL
	}
	if logger == nil {
		logger = slog.Default()
	}
	k := NewKeys(prefix, queue)
	return &DeadLetters{s: deadletter.Stream{RDB: rdb, Stream: k.Stream, Dead: k.Dead, Dedupe: k.Dedupe, TryAgain: tryAgainBudget},
		queue: queue, ttlMS: dedupeTTL.Milliseconds(), logger: logger.With("component", "redisq", "queue", queue)}, nil
}

// Len returns the number of dead-letter entries (XLEN; 0 when none).
func (d *DeadLetters) Len(ctx context.Context) (int64, error) {
	n, err := d.s.Len(ctx)
	if err != nil {
		return 0, fmt.Errorf("redisq: dead letters of %s: %w", d.queue, err)
	}
	return n, nil
}

// List returns up to count entries (count ≤ 0: 100) oldest first, starting
// after the entry id after ("" = from the start): page with the last
// DeadID.
func (d *DeadLetters) List(ctx context.Context, after string, count int) ([]DeadLetter, error) {
	if count <= 0 {
		count = 100
	}
	es, err := d.s.List(ctx, after, count)
	if err != nil {
		return nil, fmt.Errorf("redisq: listing dead letters of %s: %w", d.queue, err)
	}
	out := make([]DeadLetter, len(es))
	for i, e := range es {
		out[i] = deadLetter(e)
	}
	return out, nil
}

// Get returns the entry deadID; ok false when there is none.
func (d *DeadLetters) Get(ctx context.Context, deadID string) (dl DeadLetter, ok bool, err error) {
	e, ok, err := d.s.Get(ctx, deadID)
	if err != nil {
		return DeadLetter{}, false, fmt.Errorf("redisq: reading dead letter %s of %s: %w", deadID, d.queue, err)
	}
	return deadLetter(e), ok, nil
}

// Replay puts each entry back on the queue stream (replay.lua: XADD
// with its id, name, payload, signature and headers, its dedupe mark set, the
// dead-letter entry deleted, atomically) and returns, per deadID in order,
// the new stream entry id, or "" when the entry was not there (replayed or
// dropped before: a repeated Replay changes nothing). The receiver's inbox
// drops the job if it already has it. One script call per entry; during a
// cluster slot migration of the queue it retries TRYAGAIN (TryAgainBudget,
// within ctx). Errors: a malformed entry (lacking id, name or payload;
// drop it) or Redis errors, wrapped; the entries before it were replayed.
func (d *DeadLetters) Replay(ctx context.Context, deadIDs ...string) ([]string, error) {
	out := make([]string, 0, len(deadIDs))
	for _, id := range deadIDs {
		nid, err := d.s.Replay(ctx, id, d.ttlMS)
		if errors.Is(err, redis.Nil) {
			d.logger.InfoContext(ctx, "dead letter not replayed: no such entry (replayed or dropped already)", "dead_id", id)
			out = append(out, "")
			continue
		}
		if err != nil {
			return out, fmt.Errorf("redisq: replaying dead letter %s of %s: %w", id, d.queue, err)
		}
		d.logger.InfoContext(ctx, "dead letter replayed", "dead_id", id, "stream_id", nid)
		out = append(out, nid)
	}
	return out, nil
}

// Drop deletes the entries (XDEL) and returns how many existed; ids that do
// not exist are skipped (a repeated Drop deletes nothing).
func (d *DeadLetters) Drop(ctx context.Context, deadIDs ...string) (int64, error) {
	if len(deadIDs) == 0 {
		return 0, nil
	}
	n, err := d.s.Drop(ctx, deadIDs...)
	if err != nil {
		return 0, fmt.Errorf("redisq: dropping dead letters of %s: %w", d.queue, err)
	}
	d.logger.InfoContext(ctx, "dead letters dropped", "dead_ids", deadIDs, "dropped", n)
	return n, nil
}

// deadLetter is e as a DeadLetter.
func deadLetter(e deadletter.Entry) DeadLetter {
	return DeadLetter{DeadID: e.DeadID, Job: Job(e.Fields), Reason: e.Reason, StreamID: e.StreamID, At: e.At}
}
