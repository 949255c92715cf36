package redisq_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/internal/redisproc"
	"github.com/outboxchat/outboxchat/redisq"
)

// ReadDurability names the node: a plain client's address, and through
// Sentinel the current primary's; it tells a durable node from one with
// an eviction policy.
func TestReadDurabilityNamesTheNode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, rdb := privateRedis(t)
	nodes := redisq.ReadDurability(ctx, rdb)
	if len(nodes) != 1 || nodes[0].Addr != srv.Addr() || !nodes[0].Durable() || nodes[0].Problem() != "" {
		t.Fatalf("durable node: %+v", nodes)
	}
	sc := sentinelClient(t, srv.Addr())
	if err := rdb.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	nodes = redisq.ReadDurability(ctx, sc)
	if len(nodes) != 1 || nodes[0].Addr != srv.Addr() || nodes[0].Durable() || !nodes[0].Known() || nodes[0].MaxMemoryPolicy != "allkeys-lru" {
		t.Fatalf("non-durable node through sentinel: %+v (want %s)", nodes, srv.Addr())
	}
}

// sentinelClient starts a private Sentinel monitoring the master at addr
// (name "m", quorum 1; no failover within the test: 5 s down-after) and
// returns a fail-fast client through it (NewClient, redis+sentinel://),
// both closed when the test ends.
func sentinelClient(t *testing.T, addr string) redis.UniversalClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sn, err := redisproc.Start(ctx, &redisproc.Options{Sentinel: &redisproc.SentinelOptions{
		MasterName: "m", MasterAddr: addr, Quorum: 1, DownAfter: 5 * time.Second, FailoverTimeout: 10 * time.Second,
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sn.Close() })
	sc, err := redisq.NewClient(redisq.SentinelScheme + "://" + sn.Addr() + "/m/0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sc.Close() })
	return sc
}
