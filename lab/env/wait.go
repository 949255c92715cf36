package env

import (
	"context"
	"strings"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/redisq"
)

// RedisPrefix is the services' default --redis-prefix, which the lab keeps
// (its Redis is private).
const RedisPrefix = chat.DefaultRedisPrefix

// QueueKeys returns the Redis keys of the queue from service from (the
// stream its relay adds to and the other service's worker reads).
func QueueKeys(from string) redisq.Keys {
	return redisq.NewKeys(RedisPrefix, chat.QueueName(from))
}

// PartitionQueueKeys returns the Redis keys of partition p's queue from
// service from (chat.PartitionQueue; partition 0's are QueueKeys).
func PartitionQueueKeys(from string, p int) redisq.Keys {
	return redisq.NewKeys(RedisPrefix, chat.PartitionQueue(from, p))
}

// WaitFor polls cond every interval until it holds (nil) or ctx ends
// (ctx's error).
func WaitFor(ctx context.Context, interval time.Duration, cond func() bool) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if cond() {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// SleepUntil sleeps until t or ctx ends (then ctx's error).
func SleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-tm.C:
		return nil
	}
}

// WithoutFlag returns args without flag name and its value.
func WithoutFlag(args []string, name string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		if args[i] == name {
			i++
			continue
		}
		out = append(out, args[i])
	}
	return out
}

// ConsumersOutbox returns a FROM item holding the rows of every partition's
// consumers outbox table (chat.OutboxTable, e.Partitions of them: one at
// one partition), for the lab's checks of what is unsent; alias it.
func (e *Env) ConsumersOutbox() string {
	parts := make([]string, 0, e.Partitions)
	for p := range max(e.Partitions, 1) {
		// chat.OutboxTable is a schema and a table name: nothing to quote.
		parts = append(parts, "SELECT * FROM "+chat.OutboxTable(chat.Consumers, p))
	}
	return "(" + strings.Join(parts, " UNION ALL ") + ")"
}
