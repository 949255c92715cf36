package redisq

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultPresenceTTL is NewPresence's default ttl: a process that stops
// refreshing its presence (it died, or lost Redis) counts as gone this long
// after its last refresh. Refresh at most every third of it.
const DefaultPresenceTTL = 15 * time.Second

// claimSlots is how many names Claim tries ("<base>-0" … "<base>-999").
const claimSlots = 1000

// ErrNoFreeName is returned by Presence.Claim when every name it tries is
// held by a live process.
var ErrNoFreeName = errors.New("redisq: no free consumer name")

// Presence says which processes are live members of a consumer group,
// under which consumer name, in the queue's presence set (Keys.Presence, a
// sorted set sharing the stream's hash tag). Two processes consuming under
// one name share one pending list: each takes the other's pending entries
// for its own on a restart, and neither knows. Presence lets a process
// claim a name no live process holds (Claim) and notice when another
// process uses its name (Beat), and lets an operator list them
// (LiveConsumers).
//
// The Consumer does not use it by itself: the caller claims a name before
// NewConsumer, calls Beat at least every ttl/3 while consuming, and Leave
// on a graceful stop (so the next process may claim the name at once).
// Methods are safe for concurrent use.
type Presence struct {
	rdb      redis.UniversalClient
	keys     Keys
	group    string
	instance string
	ttl      time.Duration
}

// NewPresence returns the presence of this process in group of queue
// (under prefix, as in ConsumerConfig) through rdb, with a new instance id
// ("<host>/<pid>/<8 hex digits>", unique per call). ttl ≤ 0 means
// DefaultPresenceTTL; it has millisecond resolution. It does not touch
// Redis. Errors wrap ErrInvalidConfig: nil rdb, an empty group, an invalid
// queue name.
func NewPresence(rdb redis.UniversalClient, prefix, queue, group string, ttl time.Duration) (*Presence, error) {
	if rdb == nil || group == "" {
		return nil, fmt.Errorf("redisq: new presence: need a client and a group: %w", ErrInvalidConfig)
	}
	if err := checkQueueName(queue); err != nil {
		return nil, fmt.Errorf("redisq: new presence: %w", err)
	}
	if ttl <= 0 {
		ttl = DefaultPresenceTTL
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	host, _ := os.Hostname()
	inst := host + "/" + strconv.Itoa(os.Getpid()) + "/" + hex.EncodeToString(b[:])
	return &Presence{rdb: rdb, keys: NewKeys(prefix, queue), group: group, instance: inst, ttl: ttl}, nil
}

// Instance returns this process's instance id.
func (p *Presence) Instance() string { return p.instance }

// TTL returns how long a refresh keeps this process live.
func (p *Presence) TTL() time.Duration { return p.ttl }

// Claim registers this process under the first of "<base>-0",
// "<base>-1", … that no other live process of the group holds, atomically
// (two processes claiming at once get different names), and returns it.
// The name is as stable as it can be while unique: a process that
// replaces one that stopped (Leave) or died more than ttl ago gets the
// same name, so it finishes that name's pending entries first. Errors:
// ErrNoFreeName, Redis errors (wrapped).
func (p *Presence) Claim(ctx context.Context, base string) (string, error) {
	name, err := presenceScript.Run(ctx, p.rdb, []string{p.keys.Presence},
		p.group, p.instance, p.ttl.Milliseconds(), "claim", base, claimSlots).Text()
	if errors.Is(err, redis.Nil) {
		return "", fmt.Errorf("redisq: claiming a consumer name %s-N: %w", base, ErrNoFreeName)
	}
	if err != nil {
		return "", fmt.Errorf("redisq: claiming a consumer name: %w", err)
	}
	return name, nil
}

// Beat registers or refreshes this process as a live holder of name for
// ttl, and returns the other live processes holding the same name in the
// group (Group, Name, Instance and Expires set; nil when there are none:
// the name is this process's alone). A process that died less than its
// ttl ago is still among them: one whose Expires moves on between two
// Beats is alive. Errors: Redis errors (wrapped).
func (p *Presence) Beat(ctx context.Context, name string) ([]LiveConsumer, error) {
	vals, err := presenceScript.Run(ctx, p.rdb, []string{p.keys.Presence},
		p.group, p.instance, p.ttl.Milliseconds(), "beat", name).StringSlice()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("redisq: presence of %s: %w", name, err)
	}
	var out []LiveConsumer
	for i := 0; i+1 < len(vals); i += 2 {
		ms, _ := strconv.ParseFloat(vals[i+1], 64)
		out = append(out, LiveConsumer{Group: p.group, Name: name, Instance: vals[i], Expires: time.UnixMilli(int64(ms))})
	}
	return out, nil
}

// Leave removes this process's registration under name (a graceful stop).
// Errors: Redis errors (wrapped).
func (p *Presence) Leave(ctx context.Context, name string) error {
	if err := p.rdb.ZRem(ctx, p.keys.Presence, presenceMember(p.group, name, p.instance)).Err(); err != nil {
		return fmt.Errorf("redisq: leaving presence: %w", err)
	}
	return nil
}

// PruneGone deletes the group's consumers that have no pending entry, have
// been idle (XINFO CONSUMERS idle) for at least idle, and are held by no
// live process (scripts/prune.lua: checked and deleted atomically, so no
// entry is lost), and returns their names. Entries a dead consumer left
// pending are taken over by the live ones after LockDuration (Fetch's
// XAUTOCLAIM), after which it has none. Without this, every name that
// ever consumed stays in the group. During a cluster slot migration of the
// queue it retries TRYAGAIN (TryAgainBudget, within ctx). Errors: Redis
// errors (wrapped); a stream or group that does not exist yet deletes
// nothing.
func (p *Presence) PruneGone(ctx context.Context, idle time.Duration) ([]string, error) {
	var names []string
	err := retryTryAgain(ctx, func() (err error) {
		names, err = pruneScript.Run(ctx, p.rdb, []string{p.keys.Stream, p.keys.Presence}, p.group, idle.Milliseconds()).StringSlice()
		return err
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("redisq: pruning gone consumers: %w", err)
	}
	return names, nil
}

// LiveConsumer is one live process of a consumer group (LiveConsumers).
type LiveConsumer struct {
	// Group and Name are the group and the consumer name it consumes under.
	Group, Name string
	// Instance is its instance id (Presence.Instance).
	Instance string
	// Expires is when it stops counting as live unless refreshed (Redis
	// clock).
	Expires time.Time
	// Remaining is Expires less Redis's time when it was read
	// (LiveConsumers only). A live process refreshes at least every ttl/3,
	// so its Remaining stays above about 2/3 of its ttl; one that died
	// decays towards 0.
	Remaining time.Duration
}

// LiveConsumers lists the live processes of every group of queue (under
// prefix), sorted by group, name and instance, reading the presence
// set (two round trips: TIME, ZRANGE). Errors: Redis errors (wrapped).
// Safe for concurrent use; it changes nothing.
func LiveConsumers(ctx context.Context, rdb redis.UniversalClient, prefix, queue string) ([]LiveConsumer, error) {
	k := NewKeys(prefix, queue)
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("redisq: live consumers: %w", err)
	}
	zs, err := rdb.ZRangeByScoreWithScores(ctx, k.Presence, &redis.ZRangeBy{
		Min: "(" + strconv.FormatInt(now.UnixMilli(), 10), Max: "+inf",
	}).Result()
	if err != nil {
		return nil, fmt.Errorf("redisq: live consumers: %w", err)
	}
	out := make([]LiveConsumer, 0, len(zs))
	for _, z := range zs {
		m, _ := z.Member.(string)
		parts := strings.SplitN(m, "\x00", 3)
		if len(parts) != 3 {
			continue
		}
		exp := time.UnixMilli(int64(z.Score))
		out = append(out, LiveConsumer{Group: parts[0], Name: parts[1], Instance: parts[2], Expires: exp, Remaining: exp.Sub(now)})
	}
	slices.SortFunc(out, func(a, b LiveConsumer) int {
		return cmp.Or(strings.Compare(a.Group, b.Group), strings.Compare(a.Name, b.Name), strings.Compare(a.Instance, b.Instance))
	})
	return out, nil
}

func presenceMember(group, name, instance string) string {
	return group + "\x00" + name + "\x00" + instance
}
