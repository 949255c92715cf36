// Package presence says which processes are live members of a consumer
// group of a redisq queue, under which consumer name.
//
// Two processes consuming under one name share one pending list: each
// takes the other's pending entries for its own on a restart, and neither
// knows. A Process lets a process claim a name no live process holds
// (Claim), notice when another process uses its name (Beat), leave on a
// graceful stop (Leave) and delete the group's consumers that are gone
// (PruneGone); Live lets an operator list them.
//
// The state is the queue's presence set, redisq.Keys.Presence
// ("<prefix>q:{<queue>}:consumers"): a sorted set, member
// "<group>\x00<name>\x00<instance>", score the member's expiry (Unix ms,
// Redis clock). It shares the stream's hash tag, so it lives in the
// stream's Redis Cluster slot, and redisq.ACLRules grants it to the
// services consuming the queue. The queue itself never reads it: a
// consumer that claims no name and beats no presence consumes all the
// same.
package presence

import (
	"cmp"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/redisq"
)

// DefaultTTL is New's default ttl: a process that stops refreshing its
// presence (it died, or lost Redis) counts as gone this long after its
// last refresh. Refresh at least every third of it.
const DefaultTTL = 15 * time.Second

// claimSlots is how many names Claim tries ("<base>-0" … "<base>-999").
const claimSlots = 1000

// ErrNoFreeName is returned (wrapped) by Process.Claim when every name it
// tries is held by a live process.
var ErrNoFreeName = errors.New("presence: no free consumer name")

// scripts/presence.lua registers or refreshes a member and says who else
// holds its name (its header states KEYS, ARGV and the replies).
//
//go:embed scripts/presence.lua
var scriptSource string

var script = redis.NewScript(scriptSource)

// Process is this process's presence in one consumer group of one queue.
// It does not consume: the caller claims a name (Claim) before
// redisq.NewConsumer, calls Beat at least every TTL()/3 while consuming,
// and Leave on a graceful stop (so the next process may claim the name at
// once). Methods are safe for concurrent use.
type Process struct {
	rdb      redis.UniversalClient
	prefix   string
	queue    string
	key      string
	group    string
	instance string
	ttl      time.Duration
}

// New returns the presence of this process in group of queue (under
// prefix, as in redisq.ConsumerConfig) through rdb, with a new instance id
// ("<host>/<pid>/<8 hex digits>", unique per call). ttl ≤ 0 means
// DefaultTTL; it has millisecond resolution. It does not touch Redis.
// Errors wrap redisq.ErrInvalidConfig: a nil rdb, an empty group, a queue
// name with a brace (it would break the keys' hash tag).
func New(rdb redis.UniversalClient, prefix, queue, group string, ttl time.Duration) (*Process, error) {
	if rdb == nil || group == "" {
		return nil, fmt.Errorf("presence: new: need a client and a group: %w", redisq.ErrInvalidConfig)
	}
	if strings.ContainsAny(queue, "{}") {
		return nil, fmt.Errorf("presence: new: queue name %q contains a brace: %w", queue, redisq.ErrInvalidConfig)
	}
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	host, _ := os.Hostname()
	inst := host + "/" + strconv.Itoa(os.Getpid()) + "/" + hex.EncodeToString(b[:])
	return &Process{rdb: rdb, prefix: prefix, queue: queue, key: redisq.NewKeys(prefix, queue).Presence,
		group: group, instance: inst, ttl: ttl}, nil
}

// Instance returns this process's instance id, fixed by New
// ("<host>/<pid>/<8 hex digits>"): the third part of its members.
func (p *Process) Instance() string { return p.instance }

// TTL returns how long a refresh keeps this process live (New's ttl, or
// DefaultTTL); refresh (Beat) at least every TTL()/3.
func (p *Process) TTL() time.Duration { return p.ttl }

// Claim registers this process under the first of "<base>-0",
// "<base>-1", … "<base>-999" that no other live process of the group
// holds, atomically (two processes claiming at once get different names),
// and returns it. The name is as stable as it can be while unique: a
// process that replaces one that stopped (Leave) or died more than its
// ttl ago gets the same name, so it finishes that name's pending entries
// first. Errors: ErrNoFreeName (wrapped), Redis errors (wrapped).
func (p *Process) Claim(ctx context.Context, base string) (string, error) {
	name, err := script.Run(ctx, p.rdb, []string{p.key},
		p.group, p.instance, p.ttl.Milliseconds(), "claim", base, claimSlots).Text()
	if errors.Is(err, redis.Nil) {
		return "", fmt.Errorf("presence: claiming a consumer name %s-N: %w", base, ErrNoFreeName)
	}
	if err != nil {
		return "", fmt.Errorf("presence: claiming a consumer name: %w", err)
	}
	return name, nil
}

// Beat registers or refreshes this process as a live holder of name for
// its ttl, and returns the other live processes holding the same name in
// the group (Group, Name, Instance and Expires set, Remaining zero; nil
// when there are none: the name is this process's alone). A process that
// died less than its ttl ago is still among them: one whose Expires moves
// on between two Beats is alive. Errors: Redis errors (wrapped).
func (p *Process) Beat(ctx context.Context, name string) ([]Member, error) {
	vals, err := script.Run(ctx, p.rdb, []string{p.key},
		p.group, p.instance, p.ttl.Milliseconds(), "beat", name).StringSlice()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("presence: beating for %s: %w", name, err)
	}
	var out []Member
	for i := 0; i+1 < len(vals); i += 2 {
		ms, _ := strconv.ParseFloat(vals[i+1], 64)
		out = append(out, Member{Group: p.group, Name: name, Instance: vals[i], Expires: time.UnixMilli(int64(ms))})
	}
	return out, nil
}

// Leave removes this process's registration under name (a graceful stop).
// Leaving a name it does not hold changes nothing. Errors: Redis errors
// (wrapped).
func (p *Process) Leave(ctx context.Context, name string) error {
	if err := p.rdb.ZRem(ctx, p.key, member(p.group, name, p.instance)).Err(); err != nil {
		return fmt.Errorf("presence: leaving: %w", err)
	}
	return nil
}

// PruneGone deletes the group's consumers that have no pending entry,
// have been idle (XINFO CONSUMERS idle) for at least idle, and are held by
// no live process, and returns their names (nil when none). It reads the
// live names (Live), then deletes with redisq.DeleteIdleConsumers keeping
// them: the pending check and the delete are atomic, so no entry is lost;
// a process that claims a pruned name between the two reads under it
// again and so recreates it. Entries a dead consumer left pending are
// taken over by the live ones after the lock duration, after which it has
// none. Without this, every name that ever consumed stays in the group.
// Errors: redisq.DeleteIdleConsumers's and Live's (wrapped); a stream or
// group that does not exist yet deletes nothing.
func (p *Process) PruneGone(ctx context.Context, idle time.Duration) ([]string, error) {
	live, err := Live(ctx, p.rdb, p.prefix, p.queue)
	if err != nil {
		return nil, fmt.Errorf("presence: pruning gone consumers: %w", err)
	}
	var keep []string
	for _, m := range live {
		if m.Group == p.group {
			keep = append(keep, m.Name)
		}
	}
	names, err := redisq.DeleteIdleConsumers(ctx, p.rdb, p.prefix, p.queue, p.group, idle, slices.Compact(keep))
	if err != nil {
		return nil, fmt.Errorf("presence: pruning gone consumers: %w", err)
	}
	return names, nil
}

// Member is one live process of a consumer group (Live, Process.Beat).
type Member struct {
	// Group and Name are the group and the consumer name it consumes under.
	Group, Name string
	// Instance is its instance id (Process.Instance).
	Instance string
	// Expires is when it stops counting as live unless refreshed (Redis
	// clock, millisecond resolution).
	Expires time.Time
	// Remaining is Expires less Redis's time when it was read (Live
	// only). A live process refreshes at least every ttl/3, so its
	// Remaining stays above about 2/3 of its ttl; one that died decays
	// towards 0.
	Remaining time.Duration
}

// Live lists the live processes of every group of queue (under prefix),
// sorted by group, name and instance (empty, not nil, when there are
// none), reading the presence set in two round trips (TIME, ZRANGEBYSCORE).
// Errors: Redis errors (wrapped). Safe for concurrent use; it changes
// nothing.
func Live(ctx context.Context, rdb redis.UniversalClient, prefix, queue string) ([]Member, error) {
	key := redisq.NewKeys(prefix, queue).Presence
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("presence: listing live consumers: %w", err)
	}
	zs, err := rdb.ZRangeByScoreWithScores(ctx, key, &redis.ZRangeBy{
		Min: "(" + strconv.FormatInt(now.UnixMilli(), 10), Max: "+inf",
	}).Result()
	if err != nil {
		return nil, fmt.Errorf("presence: listing live consumers: %w", err)
	}
	out := make([]Member, 0, len(zs))
	for _, z := range zs {
		m, _ := z.Member.(string)
		parts := strings.SplitN(m, "\x00", 3)
		if len(parts) != 3 {
			continue
		}
		exp := time.UnixMilli(int64(z.Score))
		out = append(out, Member{Group: parts[0], Name: parts[1], Instance: parts[2], Expires: exp, Remaining: exp.Sub(now)})
	}
	slices.SortFunc(out, func(a, b Member) int {
		return cmp.Or(strings.Compare(a.Group, b.Group), strings.Compare(a.Name, b.Name), strings.Compare(a.Instance, b.Instance))
	})
	return out, nil
}

// member is the presence set's member of instance under name in group.
func member(group, name, instance string) string {
	return group + "\x00" + name + "\x00" + instance
}
