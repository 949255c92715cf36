package redisq

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// QueueInfo is a snapshot of one queue for operators (Inspect).
type QueueInfo struct {
	// Queue is the queue's name; Stream its stream key.
	Queue, Stream string
	// Length is the stream's entries (XLEN): undelivered, pending and
	// acknowledged but not yet trimmed.
	Length int64
	// Groups are the stream's consumer groups, in Redis's order.
	Groups []GroupInfo
	// DeadLetters is the length of the dead-letter stream.
	DeadLetters int64
}

// GroupInfo is one consumer group of a QueueInfo.
type GroupInfo struct {
	Name string
	// Pending is the entries delivered to the group and not acknowledged.
	Pending int64
	// Lag is the entries not yet delivered to the group (XINFO GROUPS
	// lag). When Redis cannot tell (entries were deleted from the middle
	// of the stream), Inspect counts them, at most lagCountMax (10,000).
	Lag int64
	// LastDeliveredID is the last entry id handed to the group.
	LastDeliveredID string
	// Consumers are the group's members.
	Consumers []ConsumerInfo
}

// ConsumerInfo is one member of a consumer group.
type ConsumerInfo struct {
	Name string
	// Pending is the entries delivered to it and not acknowledged.
	Pending int64
	// Idle is the time since it last read or acknowledged (XINFO
	// CONSUMERS idle).
	Idle time.Duration
}

// lagCountMax bounds the count of undelivered entries when XINFO GROUPS
// cannot give the lag.
const lagCountMax = 10_000

// Inspect reads a snapshot of queue (under prefix, as in PublisherConfig)
// in two round trips plus one per group (XLEN of the stream and the
// dead-letter stream, XINFO GROUPS, then XINFO CONSUMERS per group). A
// stream that does not exist yet gives a QueueInfo without groups. Errors:
// Redis errors, wrapped. Safe for concurrent use; it changes nothing.
func Inspect(ctx context.Context, rdb redis.UniversalClient, prefix, queue string) (QueueInfo, error) {
	k := NewKeys(prefix, queue)
	qi := QueueInfo{Queue: queue, Stream: k.Stream}
	pipe := rdb.Pipeline()
	xlen := pipe.XLen(ctx, k.Stream)
	dead := pipe.XLen(ctx, k.Dead)
	groups := pipe.XInfoGroups(ctx, k.Stream)
	_, _ = pipe.Exec(ctx)
	var err error
	if qi.Length, err = xlen.Result(); err != nil {
		return QueueInfo{}, fmt.Errorf("redisq: inspecting %s: %w", queue, err)
	}
	if qi.DeadLetters, err = dead.Result(); err != nil {
		return QueueInfo{}, fmt.Errorf("redisq: inspecting %s: %w", queue, err)
	}
	gs, err := groups.Result()
	if err != nil {
		if qi.Length == 0 && strings.Contains(err.Error(), "no such key") {
			return qi, nil
		}
		return QueueInfo{}, fmt.Errorf("redisq: inspecting %s: %w", queue, err)
	}
	for _, g := range gs {
		gi := GroupInfo{Name: g.Name, Pending: g.Pending, Lag: g.Lag, LastDeliveredID: g.LastDeliveredID}
		if gi.Lag < 0 {
			n, err := rdb.XRangeN(ctx, k.Stream, "("+g.LastDeliveredID, "+", lagCountMax).Result()
			if err != nil {
				return QueueInfo{}, fmt.Errorf("redisq: inspecting %s: counting lag: %w", queue, err)
			}
			gi.Lag = int64(len(n))
		}
		cs, err := rdb.XInfoConsumers(ctx, k.Stream, g.Name).Result()
		if err != nil {
			return QueueInfo{}, fmt.Errorf("redisq: inspecting %s: consumers of %s: %w", queue, g.Name, err)
		}
		for _, c := range cs {
			gi.Consumers = append(gi.Consumers, ConsumerInfo{Name: c.Name, Pending: c.Pending, Idle: c.Idle})
		}
		qi.Groups = append(qi.Groups, gi)
	}
	return qi, nil
}
