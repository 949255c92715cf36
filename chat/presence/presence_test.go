package presence_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/chat/presence"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/redisq"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// queue is one queue "chat" of the shared private Redis under a prefix of
// the test's own.
type queue struct {
	rdb    redis.UniversalClient
	prefix string
	keys   redisq.Keys
}

func newQueue(t *testing.T) *queue {
	t.Helper()
	prefix := testenv.Prefix(t)
	return &queue{rdb: testenv.Redis(t), prefix: prefix, keys: redisq.NewKeys(prefix, "chat")}
}

func (q *queue) presence(t *testing.T, ttl time.Duration) *presence.Process {
	t.Helper()
	p, err := presence.New(q.rdb, q.prefix, "chat", "workers", ttl)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// consumer is a consumer of group "workers" under name.
func (q *queue) consumer(t *testing.T, name string) *redisq.Consumer {
	t.Helper()
	c, err := redisq.NewConsumer(q.rdb, &redisq.ConsumerConfig{Queue: "chat", Prefix: q.prefix, Group: "workers",
		Consumer: name, Block: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The presence set is the queue's key, in the stream's hash tag, with the
// member layout earlier versions wrote: deployed processes of both share it.
func TestPresenceSetLayout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t)
	p := q.presence(t, time.Minute)
	if _, err := p.Beat(ctx, "w"); err != nil {
		t.Fatal(err)
	}
	zs, err := q.rdb.ZRangeWithScores(ctx, q.prefix+"q:{chat}:consumers", 0, -1).Result()
	if err != nil || len(zs) != 1 || zs[0].Member != "workers\x00w\x00"+p.Instance() {
		t.Fatalf("presence set %v, %v; want one member workers\\0w\\0%s", zs, err, p.Instance())
	}
	if q.keys.Presence != q.prefix+"q:{chat}:consumers" {
		t.Fatalf("Keys.Presence = %q", q.keys.Presence)
	}
	if _, err := presence.New(q.rdb, q.prefix, "a{b}", "workers", 0); !errors.Is(err, redisq.ErrInvalidConfig) {
		t.Fatalf("New with a brace in the queue name = %v, want ErrInvalidConfig", err)
	}
	if _, err := presence.New(q.rdb, q.prefix, "chat", "", 0); !errors.Is(err, redisq.ErrInvalidConfig) {
		t.Fatalf("New without a group = %v, want ErrInvalidConfig", err)
	}
	if p := q.presence(t, 0); p.TTL() != presence.DefaultTTL {
		t.Fatalf("TTL() = %v, want DefaultTTL", p.TTL())
	}
}

// Claim fails with ErrNoFreeName once every slot is held.
func TestPresenceClaimRunsOutOfNames(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t)
	other := q.presence(t, time.Minute)
	members := make([]redis.Z, 1000)
	exp := float64(time.Now().Add(time.Hour).UnixMilli())
	for i := range members {
		members[i] = redis.Z{Score: exp, Member: "workers\x00b-" + strconv.Itoa(i) + "\x00" + other.Instance()}
	}
	if err := q.rdb.ZAdd(ctx, q.keys.Presence, members...).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := q.presence(t, 0).Claim(ctx, "b"); !errors.Is(err, presence.ErrNoFreeName) {
		t.Fatalf("Claim with every name held = %q, %v; want ErrNoFreeName", n, err)
	}
}

// Two processes claiming the same base at once get different names; a
// name left (graceful stop) or expired (a dead process) is claimed again.
func TestPresenceClaimsUniqueNames(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t)
	a, b := q.presence(t, 0), q.presence(t, 300*time.Millisecond)
	na, err := a.Claim(ctx, "workers-host")
	if err != nil {
		t.Fatal(err)
	}
	nb, err := b.Claim(ctx, "workers-host")
	if err != nil {
		t.Fatal(err)
	}
	if na != "workers-host-0" || nb != "workers-host-1" {
		t.Fatalf("claimed %q and %q, want workers-host-0 and workers-host-1", na, nb)
	}
	// a stops gracefully: a new process gets its name (and its pending list).
	if err := a.Leave(ctx, na); err != nil {
		t.Fatal(err)
	}
	c := q.presence(t, 0)
	if n, err := c.Claim(ctx, "workers-host"); err != nil || n != na {
		t.Fatalf("claim after leave = %q, %v; want %q", n, err, na)
	}
	// b dies (no refresh): its name is free once its ttl has passed.
	d := q.presence(t, 0)
	var n string
	deadline := time.Now().Add(5 * time.Second)
	for n != nb && time.Now().Before(deadline) {
		if n != "" {
			_ = d.Leave(ctx, n)
		}
		if n, err = d.Claim(ctx, "workers-host"); err != nil {
			t.Fatal(err)
		}
	}
	if n != nb {
		t.Fatalf("claim after b expired = %q, want %q", n, nb)
	}
	live, err := presence.Live(ctx, q.rdb, q.prefix, "chat")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range live {
		names = append(names, l.Name+"="+l.Instance)
	}
	want := []string{na + "=" + c.Instance(), nb + "=" + d.Instance()}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Fatalf("live consumers %v, want %v", names, want)
	}
}

// Two live processes given the same explicit name see each other.
func TestPresenceBeatReportsSharedName(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t)
	a, b := q.presence(t, 0), q.presence(t, 0)
	if others, err := a.Beat(ctx, "w"); err != nil || others != nil {
		t.Fatalf("first beat = %v, %v; want alone", others, err)
	}
	if others, err := b.Beat(ctx, "w"); err != nil || len(others) != 1 || others[0].Instance != a.Instance() || others[0].Name != "w" {
		t.Fatalf("b's beat = %v, %v; want [%s]", others, err, a.Instance())
	}
	first, err := a.Beat(ctx, "w")
	if err != nil || len(first) != 1 || first[0].Instance != b.Instance() {
		t.Fatalf("a's beat = %v, %v; want [%s]", first, err, b.Instance())
	}
	// b refreshes: a sees its expiry move on (b is alive).
	testenv.WaitFor(t, 5*time.Second, "b's expiry to move on", func() bool {
		if _, err := b.Beat(ctx, "w"); err != nil {
			t.Fatal(err)
		}
		again, err := a.Beat(ctx, "w")
		return err == nil && len(again) == 1 && again[0].Expires.After(first[0].Expires)
	})
	// Another group's "w" is not the same consumer.
	o, err := presence.New(q.rdb, q.prefix, "chat", "consumers", 0)
	if err != nil {
		t.Fatal(err)
	}
	if others, err := o.Beat(ctx, "w"); err != nil || others != nil {
		t.Fatalf("other group's beat = %v, %v; want alone", others, err)
	}
	if err := b.Leave(ctx, "w"); err != nil {
		t.Fatal(err)
	}
	if others, err := a.Beat(ctx, "w"); err != nil || others != nil {
		t.Fatalf("beat after b left = %v, %v; want alone", others, err)
	}
}

// PruneGone deletes a dead consumer once it has nothing pending, never a
// live one or one with pending entries.
func TestPresencePrunesGoneConsumers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t)
	live := q.presence(t, 0)
	if gone, err := live.PruneGone(ctx, 0); err != nil || len(gone) != 0 {
		t.Fatalf("prune before the stream exists = %v, %v", gone, err)
	}
	if _, err := live.Beat(ctx, "live"); err != nil {
		t.Fatal(err)
	}
	pub, err := redisq.NewPublisher(q.rdb, &redisq.PublisherConfig{Queue: "chat", Prefix: q.prefix})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Add(ctx, redisq.Job{ID: "job-0", Name: "message.created", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	// "dead" took an entry and died with it pending; "idle" read nothing
	// and died; "live" is alive and idle.
	if ds, err := q.consumer(t, "dead").Fetch(ctx, 1); err != nil || len(ds) != 1 {
		t.Fatalf("dead's fetch = %v, %v; want the entry", ds, err)
	}
	for _, n := range []string{"idle", "live"} {
		if _, err := q.consumer(t, n).Fetch(ctx, 1); err != nil {
			t.Fatal(err)
		}
	}
	gone, err := live.PruneGone(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := q.rdb.XInfoConsumers(ctx, q.keys.Stream, "workers").Result()
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, c := range cons {
		left = append(left, c.Name)
	}
	slices.Sort(left)
	if !slices.Contains(gone, "idle") || slices.Contains(gone, "dead") || slices.Contains(gone, "live") ||
		!slices.Equal(left, []string{"dead", "live"}) {
		t.Fatalf("pruned %v, left %v; want idle pruned, dead (pending) and live kept", gone, left)
	}
	// An idle threshold not yet reached keeps everyone.
	if gone, err := live.PruneGone(ctx, time.Hour); err != nil || len(gone) != 0 {
		t.Fatalf("prune with 1h idle = %v, %v", gone, err)
	}
}

// A service's least-privilege Redis user (redisq.ACLRules, which the
// chat's ACL builds on) may do all of it on the queue it consumes.
func TestPresenceUnderTheQueueACL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t)
	user := "u-" + strings.TrimSuffix(q.prefix, ":")
	args := []any{"ACL", "SETUSER", user, "reset", ">pw"}
	for _, r := range redisq.ACLRules(q.prefix, "out", "chat") {
		args = append(args, r)
	}
	if err := q.rdb.Do(ctx, args...).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.rdb.Do(context.Background(), "ACL", "DELUSER", user).Err() })
	opts := q.rdb.(*redis.Client).Options()
	limited := redis.NewClient(&redis.Options{Addr: opts.Addr, Username: user, Password: "pw"})
	t.Cleanup(func() { _ = limited.Close() })
	// The group exists and has a consumer that is gone.
	if err := q.rdb.XGroupCreateMkStream(ctx, q.keys.Stream, "workers", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := q.rdb.XGroupCreateConsumer(ctx, q.keys.Stream, "workers", "gone").Err(); err != nil {
		t.Fatal(err)
	}
	p, err := presence.New(limited, q.prefix, "chat", "workers", 0)
	if err != nil {
		t.Fatal(err)
	}
	name, err := p.Claim(ctx, "w")
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	if _, err := p.Beat(ctx, name); err != nil {
		t.Fatalf("Beat: %v", err)
	}
	if live, err := presence.Live(ctx, limited, q.prefix, "chat"); err != nil || len(live) != 1 {
		t.Fatalf("Live = %v, %v; want this process", live, err)
	}
	if gone, err := p.PruneGone(ctx, 0); err != nil || !slices.Equal(gone, []string{"gone"}) {
		t.Fatalf("PruneGone = %v, %v; want [gone]", gone, err)
	}
	if err := p.Leave(ctx, name); err != nil {
		t.Fatalf("Leave: %v", err)
	}
}
