package redisq

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/internal/queuescript"
)

// DeleteIdleConsumers deletes the consumers of group on queue (under
// prefix, as in ConsumerConfig) through rdb that have no pending entry,
// have been idle (XINFO CONSUMERS idle, millisecond resolution) for at
// least idle, and are not named in keep, and returns their names in
// Redis's order (nil when none). Without it every consumer name that
// ever read stays in the group: an application that gives its processes
// unique names calls it now and then, keeping the names its live
// processes use.
//
// The check and the delete run in one script (delete_idle.lua),
// so no entry is delivered to a consumer between the two and none is
// lost: XGROUP DELCONSUMER would drop a consumer's pending entries with
// it. Entries a dead consumer left pending are taken over by the live
// ones after LockDuration (Fetch's XAUTOCLAIM), after which it has none.
// A deleted consumer that reads again is created again by XREADGROUP.
// During a cluster slot migration of the queue it retries TRYAGAIN
// (TryAgainBudget, within ctx).
//
// Errors: ErrInvalidConfig (wrapped: a nil rdb, an empty group, an
// invalid queue name); Redis errors (wrapped). A stream or group that
// does not exist yet deletes nothing. Safe for concurrent use.
func DeleteIdleConsumers(ctx context.Context, rdb redis.UniversalClient, prefix, queue, group string, idle time.Duration, keep []string) ([]string, error) {
	if rdb == nil || group == "" {
		return nil, fmt.Errorf("redisq: deleting idle consumers: need a client and a group: %w", ErrInvalidConfig)
	}
	if err := checkQueueName(queue); err != nil {
		return nil, fmt.Errorf("redisq: deleting idle consumers: %w", err)
	}
	args := make([]any, 0, 2+len(keep))
	args = append(args, group, max(idle, 0).Milliseconds())
	for _, k := range keep {
		args = append(args, k)
	}
	stream := NewKeys(prefix, queue).Stream
	var names []string
	err := retryTryAgain(ctx, func() (err error) {
		names, err = queuescript.DeleteIdle.Run(ctx, rdb, []string{stream}, args...).StringSlice()
		return err
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("redisq: deleting idle consumers: %w", err)
	}
	if len(names) == 0 {
		return nil, nil
	}
	return names, nil
}
