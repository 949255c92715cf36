package server

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/chat/schema"
	"github.com/outboxchat/outboxchat/internal/redisproc"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/redisq"
)

// Both services run on a Redis Cluster of three masters through a
// redis+cluster:// URL, each as its least-privilege ACL user (set on every
// node through the cluster client): messages flow both ways, each
// direction's queue keys sit in one slot, and the durability gauge has
// one series per master.
func TestServeOnRedisCluster(t *testing.T) {
	t.Parallel()
	cl, h, urls := clusterUsers(t, 1)
	_, work := sendThreeEachWay(t, h, urls, 7)

	for _, svc := range []string{chat.Consumers, chat.Workers} {
		k := redisq.NewKeys(h.Prefix, chat.QueueName(svc))
		inStreamSlot(t, cl, k, k.Dead, k.Presence, k.Dedupe, k.DedupeTokens)
	}
	for _, addr := range cl.Addrs() {
		series := `outboxchat_redis_durable{node="` + addr + `"}`
		testenv.WaitFor(t, 10*time.Second, series, func() bool { return scrape(t, work.base, series) == 1 })
	}
	if m, err := chattest.Get(work.base + "/metrics"); err != nil || strings.Count(m, "outboxchat_redis_durable{") != 3 {
		t.Fatalf("durability series: %v\n%s", err, m)
	}
}

// clusterUsers starts a private Redis Cluster of three masters and a
// harness on it, and gives each service its least-privilege ACL user for
// partitions partitions per direction, set on every node through the
// cluster client (checked on each node). It returns each service's Redis
// URL as that user.
func clusterUsers(t *testing.T, partitions int) (*redisproc.Cluster, *harness, map[string]string) {
	t.Helper()
	ctx := context.Background()
	cl := testenv.RedisCluster(t, 3)
	h := newHarness(t, cl.URL())
	admin, err := redisq.NewClient(cl.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	urls := map[string]string{}
	for _, svc := range []string{chat.Consumers, chat.Workers} {
		user := "u-" + svc
		args, err := schema.RedisACLPartitions(svc, h.Prefix, user, "pw-"+user, partitions)
		if err != nil {
			t.Fatal(err)
		}
		if err := schema.ApplyRedisACL(ctx, admin, args); err != nil {
			t.Fatal(err)
		}
		for _, addr := range cl.Addrs() {
			nc := redis.NewClient(&redis.Options{Addr: addr})
			err := nc.Do(ctx, "ACL", "GETUSER", user).Err()
			_ = nc.Close()
			if err != nil {
				t.Fatalf("user %s on node %s: %v", user, addr, err)
			}
		}
		urls[svc] = withRedisUser(t, cl.URL(), user)
	}
	return cl, h, urls
}

// inStreamSlot fails t unless each of keys sits in the slot, and on the
// master, of k's stream, and returns that master's address.
func inStreamSlot(t *testing.T, cl *redisproc.Cluster, k redisq.Keys, keys ...string) string {
	t.Helper()
	ctx := context.Background()
	node, slot, err := cl.NodeFor(ctx, k.Stream)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range keys {
		if n, s, err := cl.NodeFor(ctx, key); err != nil || n != node || s != slot {
			t.Fatalf("%s: slot %d on %v, the stream's %d on %s (%v)", key, s, n, slot, node.Addr(), err)
		}
	}
	return node.Addr()
}

// Messages sent while the slot of their queue moves to another master —
// before any key moved, with only the stream moved, with every key moved
// before the hand-over — all arrive, once and in order: while only the
// stream has moved the relay's adds meet TRYAGAIN (the source node, which
// still holds the dedupe marks, counts them) and are retried within the
// call or on the relay's next pass.
func TestServeDuringSlotMove(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cl := testenv.RedisCluster(t, 3)
	h := newHarness(t, cl.URL())
	cons := h.start(chat.Consumers, nil)
	work := h.start(chat.Workers, nil)
	ww := chattest.Watch(t, work.base, 9)
	send := func(n int) {
		for range n {
			chattest.Send(t, cons.base, 9, "to workers")
		}
	}
	send(3)
	ww.WaitSeqs(t, chat.Consumers, 3, 20*time.Second)

	k := redisq.NewKeys(h.Prefix, chat.QueueName(chat.Consumers))
	from, slot, err := cl.NodeFor(ctx, k.Stream)
	if err != nil {
		t.Fatal(err)
	}
	to := cl.Nodes[0]
	if to == from {
		to = cl.Nodes[1]
	}
	fc := redis.NewClient(&redis.Options{Addr: from.Addr()})
	defer fc.Close()
	tryAgains := func() int64 {
		for _, line := range strings.Split(fc.Info(ctx, "errorstats").Val(), "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "errorstat_TRYAGAIN:count="); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
		return 0
	}
	m, err := cl.StartSlotMove(ctx, slot, to)
	if err != nil {
		t.Fatal(err)
	}
	send(3)
	if err := m.Migrate(ctx, k.Stream); err != nil {
		t.Fatal(err)
	}
	send(3)
	testenv.WaitFor(t, 10*time.Second, "the relay's adds meet TRYAGAIN on the source", func() bool { return tryAgains() > 0 })
	if err := m.MigrateRest(ctx); err != nil {
		t.Fatal(err)
	}
	send(3)
	if err := m.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	send(3)
	ww.WaitSeqs(t, chat.Consumers, 15, 30*time.Second)
	if n, s, err := cl.NodeFor(ctx, k.Dead); err != nil || n != to || s != slot {
		t.Fatalf("after the move the queue's keys are on %v (slot %d, %v), want %s", n, s, err, to.Addr())
	}
}

// Both services through a cluster failover: a master holding the
// consumers' queue is killed while its replica, held back, lacks the last
// messages the relay handed it (and marked sent); the replica is promoted.
// Messages sent before, while the replica is held back, during the kill
// and promotion, and after, are each shown once, in order, none lost: the
// re-drive brings what the promoted replica never had.
func TestServeThroughClusterFailover(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, err := redisproc.StartCluster(ctx, 3, &redisproc.Options{ClusterNodeTimeout: time.Second, ClusterReplicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	h := newHarness(t, cl.URL())
	fast := func(c *Config) { c.LockDuration = time.Second } // re-drive after 2 s
	cons := h.start(chat.Consumers, fast)
	work := h.start(chat.Workers, fast)
	w := chattest.Watch(t, work.base, 9)
	send := func(n int, what string) {
		for i := 1; i <= n; i++ {
			chattest.Send(t, cons.base, 9, fmt.Sprint(what, " ", i))
		}
	}
	send(3, "before")
	w.WaitSeqs(t, chat.Consumers, 3, 20*time.Second)

	// Workers stopped: what the old master takes waits in its stream only.
	work.stop()
	k := redisq.NewKeys(h.Prefix, chat.QueueName(chat.Consumers))
	master, _, err := cl.NodeFor(ctx, k.Stream)
	if err != nil {
		t.Fatal(err)
	}
	f, err := cl.StartFailover(ctx, master)
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.HoldBack(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Release() })
	send(3, "only the old master")
	testenv.WaitFor(t, 10*time.Second, "the relay to publish to the old master", func() bool {
		return h.Count(t, `SELECT count(*) FROM consumers.outbox WHERE sent_at IS NULL`) == 0
	})
	// The entries only the old master took: their IDs, not a count, since
	// the relay publishes to the promoted replica as soon as it can.
	held, err := nodeClient(t, master).XRevRangeN(ctx, k.Stream, "+", "-", 3).Result()
	if err != nil || len(held) != 3 {
		t.Fatalf("the old master's last entries: %v, %v", held, err)
	}
	killed := make(chan error, 1)
	go func() { killed <- f.KillMaster(ctx) }()
	send(3, "during the failover")
	if err := <-killed; err != nil {
		t.Fatal(err)
	}
	rc := nodeClient(t, f.Replica)
	for _, e := range held {
		if got, err := rc.XRange(ctx, k.Stream, e.ID, e.ID).Result(); err != nil || len(got) != 0 {
			t.Fatalf("the promoted replica holds entry %s (%v): it was not held back", e.ID, err)
		}
	}
	send(3, "after")
	work = h.start(chat.Workers, fast)
	redriveHealed(t, h, cons, work, 12, 60*time.Second)
}

// nodeClient is a plain client of one cluster node, closed when the test
// ends.
func nodeClient(t *testing.T, s *redisproc.Server) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}
