package redisproc

import (
	"context"
	"fmt"
	"os"
	"strconv"
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

// StartCluster with replicas joins three masters and a replica of each;
// a master whose replica was held back (frozen, link cut) takes a write
// the replica never gets, is killed, and the replica is promoted without
// that write; a cluster client writes through the new master; the old
// master restarts as its replica and drops the write.
func TestClusterFailover(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	c, err := StartCluster(ctx, 3, &Options{ClusterNodeTimeout: time.Second, ClusterReplicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if len(c.Nodes) != 6 || c.Shards != 3 {
		t.Fatalf("nodes %d, shards %d: want 6 and 3", len(c.Nodes), c.Shards)
	}
	for _, s := range c.Nodes {
		if lo := ephemeralLow(t); s.BusPort() >= lo {
			t.Errorf("node %s: bus port %d in the ephemeral range (from %d)", s.Addr(), s.BusPort(), lo)
		}
	}
	masters, err := c.Masters(ctx)
	if err != nil || len(masters) != 3 {
		t.Fatalf("masters %v, %v", masters, err)
	}
	for i, m := range masters {
		if m != c.Nodes[i] {
			t.Fatalf("master %d is %s, want %s", i, m.Addr(), c.Nodes[i].Addr())
		}
		reps, err := c.ReplicasOf(ctx, m)
		if err != nil || len(reps) != 1 || reps[0] != c.Nodes[3+i] {
			t.Fatalf("replicas of %s: %v, %v; want %s", m.Addr(), reps, err, c.Nodes[3+i].Addr())
		}
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = cc.Close() })
	master, _, err := c.NodeFor(ctx, "{q}kept")
	if err != nil {
		t.Fatal(err)
	}
	if err := cc.Set(ctx, "{q}kept", 1, 0).Err(); err != nil {
		t.Fatal(err)
	}
	f, err := c.StartFailover(ctx, master)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.HoldBack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cc.Set(ctx, "{q}lost", 1, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := f.KillMaster(ctx); err != nil {
		t.Fatal(err)
	}
	if n, _, err := c.NodeFor(ctx, "{q}kept"); err != nil || n != f.Replica {
		t.Fatalf("after the failover {q} is on %v, %v; want %s", n, err, f.Replica.Addr())
	}
	rc := client(t, f.Replica)
	if n, err := rc.Exists(ctx, "{q}kept", "{q}lost").Result(); err != nil || n != 1 {
		t.Fatalf("promoted replica holds %d of {q}kept, {q}lost (%v): want the first only", n, err)
	}
	// No MOVED comes from a dead node: the client learns the new owner
	// when it reloads the slots.
	cc.ReloadState(ctx)
	if err := poll(ctx, func() (string, bool) {
		err := cc.Set(ctx, "{q}after", 1, 0).Err()
		return fmt.Sprint(err), err == nil
	}); err != nil {
		t.Fatalf("cluster client write after the failover: %v", err)
	}
	if err := f.Rejoin(ctx); err != nil {
		t.Fatal(err)
	}
	if reps, err := c.ReplicasOf(ctx, f.Replica); err != nil || len(reps) != 1 || reps[0] != f.Master {
		t.Fatalf("replicas of the promoted node: %v, %v; want the old master", reps, err)
	}
	// A replica answers reads of its master's slots after READONLY.
	old := redis.NewClient(&redis.Options{Addr: f.Master.Addr(), OnConnect: func(ctx context.Context, cn *redis.Conn) error {
		return cn.ReadOnly(ctx).Err()
	}})
	t.Cleanup(func() { _ = old.Close() })
	if err := poll(ctx, func() (string, bool) {
		n, err := old.Exists(ctx, "{q}kept", "{q}lost", "{q}after").Result()
		return fmt.Sprint(n, err), err == nil && n == 2
	}); err != nil {
		t.Fatalf("the old master, now a replica, keeps {q}lost or lacks {q}after: %v", err)
	}

	// Back the other way, with the replica in sync at the kill: the last
	// write survives.
	back, err := c.StartFailover(ctx, f.Replica)
	if err != nil || back.Replica != f.Master {
		t.Fatalf("failover back: %+v, %v", back, err)
	}
	if err := cc.Set(ctx, "{q}synced", 1, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := back.SyncReplica(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := back.KillMaster(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := client(t, f.Master).Exists(ctx, "{q}synced").Result(); err != nil || n != 1 {
		t.Fatalf("{q}synced on the node promoted after SyncReplica: %d, %v", n, err)
	}

	// A master paused past the node timeout is failed over; resumed, it
	// claims its slots until it learns it was replaced: WaitSettled
	// returns only once it says it is a replica.
	ms, err := c.Masters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var paused, promoted *Server
	for _, m := range ms {
		if reps, err := c.ReplicasOf(ctx, m); err == nil && len(reps) == 1 && m != f.Master {
			paused, promoted = m, reps[0]
			break
		}
	}
	if paused == nil {
		t.Fatalf("no other master with a running replica among %v", ms)
	}
	if err := paused.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, func() (string, bool) {
		r, err := c.Role(ctx, promoted)
		return fmt.Sprint(r, err), err == nil && r.Master
	}); err != nil {
		t.Fatalf("the paused master's replica not promoted: %v", err)
	}
	if err := paused.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitSettled(ctx); err != nil {
		t.Fatal(err)
	}
	if r, err := c.Role(ctx, paused); err != nil || r.Master {
		t.Fatalf("the resumed node is %+v (%v) once settled; want a replica", r, err)
	}
}

// ephemeralLow is the first port of the kernel's ephemeral range.
func ephemeralLow(t *testing.T) int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Skip(err)
	}
	n, err := strconv.Atoi(strings.Fields(string(b))[0])
	if err != nil {
		t.Fatal(err)
	}
	return n
}
