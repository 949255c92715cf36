package redisproc

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartCluster joins three masters that split the slots, on loopback
// ports of their own (bus ports too); a go-redis cluster client writes
// keys of every node's slots through them; a stopped master turns the
// others' state to fail, and its restart (same ports, nodes.conf kept)
// to ok again.
func TestCluster(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	c, err := StartCluster(ctx, 3, &Options{ClusterNodeTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if len(c.Nodes) != 3 || !strings.HasPrefix(c.URL(), "redis+cluster://127.0.0.1:") {
		t.Fatalf("nodes %d, URL %s", len(c.Nodes), c.URL())
	}
	seen := map[int]bool{}
	for _, s := range c.Nodes {
		if s.BusPort() == 0 || s.BusPort() == s.Port() || s.Port() == 6379 {
			t.Fatalf("node %s: port %d, bus port %d", s.Addr(), s.Port(), s.BusPort())
		}
		seen[s.Port()], seen[s.BusPort()] = true, true
	}
	if len(seen) != 6 {
		t.Fatalf("ports %v: want 6 distinct", seen)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()[:1], MaxRetries: -1})
	t.Cleanup(func() { _ = cc.Close() })
	owners := map[*Server]bool{}
	for i := range 64 {
		key := "k" + string(rune('a'+i%26)) + strings.Repeat("x", i)
		if err := cc.Set(ctx, key, i, 0).Err(); err != nil {
			t.Fatalf("set %s: %v", key, err)
		}
		node, _, err := c.NodeFor(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if n, err := client(t, node).Exists(ctx, key).Result(); err != nil || n != 1 {
			t.Fatalf("key %s not on its owner %s: %d, %v", key, node.Addr(), n, err)
		}
		owners[node] = true
	}
	if len(owners) != 3 {
		t.Fatalf("64 keys landed on %d nodes, want 3", len(owners))
	}

	// A slot moves with its key; the client follows ASK meanwhile and
	// MOVED after.
	from, slot, err := c.NodeFor(ctx, "ka")
	if err != nil {
		t.Fatal(err)
	}
	to := c.Nodes[0]
	if to == from {
		to = c.Nodes[1]
	}
	m, err := c.StartSlotMove(ctx, slot, to)
	if err != nil || m.From != from || m.To != to || m.Slot != slot {
		t.Fatalf("StartSlotMove = %+v, %v", m, err)
	}
	if err := m.MigrateRest(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cc.Set(ctx, "ka", "asked", 0).Err(); err != nil {
		t.Fatalf("set during the move: %v", err)
	}
	if err := m.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	if n, _, err := c.NodeFor(ctx, "ka"); err != nil || n != to {
		t.Fatalf("after the move ka is on %v, %v; want %s", n, err, to.Addr())
	}
	if v, err := client(t, to).Get(ctx, "ka").Result(); err != nil || v != "asked" {
		t.Fatalf("ka on the target = %q, %v", v, err)
	}
	if v, err := cc.Get(ctx, "ka").Result(); err != nil || v != "asked" {
		t.Fatalf("get after the move = %q, %v", v, err)
	}

	if err := c.Nodes[2].Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitState(ctx, "fail"); err != nil {
		t.Fatal(err)
	}
	if err := c.Nodes[2].Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitState(ctx, "ok"); err != nil {
		t.Fatal(err)
	}
}
