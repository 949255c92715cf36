// Package deadletter is a queue's dead-letter stream on Redis: moving a
// consumer group's pending entry into it (added, acknowledged and the
// stream capped in one MULTI), and reading, replaying and dropping its
// entries. Each entry holds the job's fields (streamentry) and reason and
// stream_id. Logging and events are the caller's.
package deadletter

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/internal/queuescript"
	"github.com/outboxchat/outboxchat/internal/streamentry"
	"github.com/outboxchat/outboxchat/internal/tryagain"
)

// Field names of a dead-letter entry besides the job's.
const (
	ReasonField   = "reason"
	StreamIDField = "stream_id"
)

// Stream is the dead-letter stream Dead of the queue stream Stream, whose
// dedupe marks are Dedupe (all three keys in one hash-tag slot). TryAgain
// bounds the retries of a call a slot migration refused (tryagain.Retry).
// A Stream is a plain value, safe for concurrent use.
type Stream struct {
	RDB                  redis.UniversalClient
	Stream, Dead, Dedupe string
	TryAgain             time.Duration
}

// Entry is one dead-letter entry as read back: fields it lacks are empty
// (headers that do not decode are nil). At is when it was dead-lettered
// (DeadID's milliseconds, the Redis clock).
type Entry struct {
	DeadID           string
	Fields           streamentry.Fields
	Reason, StreamID string
	At               time.Time
}

// Move moves the entry streamID, holding f, pending in group, to the
// dead-letter stream: after a check that it is still pending in group
// (false, nil when not: another consumer settled it; nothing done), one
// MULTI adds it (with reason and its stream id), acknowledges it and,
// when max > 0, trims the dead-letter stream to max entries. trimmed is
// how many that trim dropped. A MULTI refused by a slot migration is
// retried (TryAgain). Errors are Redis's; then none of the steps happened.
func (s Stream) Move(ctx context.Context, group, streamID string, f streamentry.Fields, reason string, max int64) (moved bool, trimmed int64, err error) {
	pend, err := s.RDB.XPendingExt(ctx, &redis.XPendingExtArgs{
		Stream: s.Stream, Group: group, Start: streamID, End: streamID, Count: 1}).Result()
	if err != nil || len(pend) == 0 {
		return false, 0, err
	}
	var trim *redis.IntCmd
	tx := func(pipe redis.Pipeliner) error {
		pipe.XAdd(ctx, &redis.XAddArgs{
			Stream: s.Dead,
			Values: append(streamentry.Values(f), ReasonField, reason, StreamIDField, streamID),
		})
		pipe.XAck(ctx, s.Stream, group, streamID)
		if max > 0 {
			trim = pipe.XTrimMaxLen(ctx, s.Dead, max)
		}
		return nil
	}
	// A MULTI whose keys are split between two nodes during a slot
	// migration gets TRYAGAIN and runs none of its commands.
	err = tryagain.Retry(ctx, s.TryAgain, func() error {
		_, err := s.RDB.TxPipelined(ctx, tx)
		return err
	})
	if err != nil {
		return false, 0, err
	}
	if trim != nil {
		trimmed = trim.Val()
	}
	return true, trimmed, nil
}

// Len is the number of entries (XLEN; 0 when none).
func (s Stream) Len(ctx context.Context) (int64, error) {
	return s.RDB.XLen(ctx, s.Dead).Result()
}

// List returns up to count entries oldest first, after the entry id after
// ("": from the start).
func (s Stream) List(ctx context.Context, after string, count int) ([]Entry, error) {
	start := "-"
	if after != "" {
		start = "(" + after
	}
	msgs, err := s.RDB.XRangeN(ctx, s.Dead, start, "+", int64(count)).Result()
	if err != nil {
		return nil, err
	}
	out := make([]Entry, len(msgs))
	for i, m := range msgs {
		out[i] = entry(m)
	}
	return out, nil
}

// Get returns the entry deadID; ok false when there is none.
func (s Stream) Get(ctx context.Context, deadID string) (e Entry, ok bool, err error) {
	msgs, err := s.RDB.XRange(ctx, s.Dead, deadID, deadID).Result()
	if err != nil || len(msgs) == 0 {
		return Entry{}, false, err
	}
	return entry(msgs[0]), true, nil
}

// Replay puts the entry deadID back on the queue stream (replay.lua: XADD
// of its fields, its dedupe mark set for ttlMS, the dead-letter entry
// deleted, atomically) and returns the new stream entry id, or redis.Nil
// when the entry is not there. A call refused by a slot migration is
// retried (TryAgain).
func (s Stream) Replay(ctx context.Context, deadID string, ttlMS int64) (string, error) {
	var nid string
	err := tryagain.Retry(ctx, s.TryAgain, func() (err error) {
		// A missing entry is a nil reply: redis.Nil.
		nid, err = queuescript.Replay.Run(ctx, s.RDB, []string{s.Dead, s.Stream, s.Dedupe}, deadID, ttlMS).Text()
		return err
	})
	return nid, err
}

// Drop deletes the entries (XDEL) and returns how many existed.
func (s Stream) Drop(ctx context.Context, deadIDs ...string) (int64, error) {
	return s.RDB.XDel(ctx, s.Dead, deadIDs...).Result()
}

// entry reads a dead-letter entry; fields it lacks stay empty.
func entry(m redis.XMessage) Entry {
	str := func(k string) string { s, _ := m.Values[k].(string); return s }
	f, _ := streamentry.Decode(m.ID, m.Values)
	e := Entry{DeadID: m.ID, Fields: f, Reason: str(ReasonField), StreamID: str(StreamIDField)}
	var ms, seq int64
	if _, err := fmt.Sscanf(m.ID, "%d-%d", &ms, &seq); err == nil {
		e.At = time.UnixMilli(ms)
	}
	return e
}
