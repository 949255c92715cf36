package redisproc

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterSlots is the number of hash slots of a Redis Cluster.
const ClusterSlots = 16384

// Cluster is a private Redis Cluster, each node a Server started with
// Options.Cluster: Shards masters that split the slots evenly, each with
// Options.ClusterReplicas replicas. All methods are safe for concurrent
// use.
type Cluster struct {
	// Nodes are every node: the masters first, Nodes[i] (i < Shards)
	// serving at the start the i-th of Shards equal ranges of slots, then
	// the replicas, master i's j-th at Nodes[Shards+i*R+j] (R replicas a
	// master). A failover swaps roles: Role, Masters and ReplicasOf say who
	// is what now.
	Nodes []*Server
	// Shards is the number of masters StartCluster made (len(Nodes) without
	// replicas).
	Shards int
	// ids are the nodes' cluster node ids, in Nodes order (kept across
	// restarts in nodes.conf).
	ids []string
}

// StartCluster starts n (≥ 1) masters and opts.ClusterReplicas replicas of
// each with opts (Port and Dir must be unset; Cluster is implied), joins
// them (CLUSTER MEET on their bus ports), assigns the slots to the masters
// (CLUSTER ADDSLOTSRANGE), makes the replicas (CLUSTER REPLICATE), and
// waits until every node reports cluster_state:ok and knows every slot's
// owner and every replica's link to its master is up. ctx bounds the
// whole start; on error every node started is closed.
func StartCluster(ctx context.Context, n int, opts *Options) (*Cluster, error) {
	if n < 1 {
		return nil, errors.New("redisproc: a cluster needs at least one node")
	}
	o := Options{}
	if opts != nil {
		o = *opts
	}
	if o.Port != 0 || o.Dir != "" {
		return nil, errors.New("redisproc: StartCluster picks each node's port and dir")
	}
	if o.ClusterReplicas < 0 {
		return nil, errors.New("redisproc: negative ClusterReplicas")
	}
	o.Cluster = true
	c := &Cluster{Shards: n}
	fail := func(err error) (*Cluster, error) {
		_ = c.Close()
		return nil, err
	}
	for range n * (1 + o.ClusterReplicas) {
		s, err := Start(ctx, &o)
		if err != nil {
			return fail(err)
		}
		c.Nodes = append(c.Nodes, s)
	}
	for i, s := range c.Nodes {
		err := withClient(ctx, s, func(rc *redis.Client) error {
			id, err := rc.ClusterMyID(ctx).Result()
			if err != nil {
				return fmt.Errorf("cluster myid: %w", err)
			}
			c.ids = append(c.ids, id)
			if i > 0 {
				first := c.Nodes[0]
				if err := rc.Do(ctx, "CLUSTER", "MEET", "127.0.0.1", first.Port(), first.BusPort()).Err(); err != nil {
					return fmt.Errorf("cluster meet: %w", err)
				}
			}
			if i >= n {
				return nil
			}
			lo, hi := i*ClusterSlots/n, (i+1)*ClusterSlots/n-1
			return rc.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err()
		})
		if err != nil {
			return fail(fmt.Errorf("redisproc: cluster node %s: %w", s.Addr(), err))
		}
	}
	for i, s := range c.Nodes[n:] {
		master := c.ids[i/o.ClusterReplicas]
		// The replica must have learnt of its master (gossip from the
		// MEETs) before it can replicate it: until then it answers
		// "Unknown node".
		err := withClient(ctx, s, func(rc *redis.Client) error {
			return poll(ctx, func() (string, bool) {
				err := rc.Do(ctx, "CLUSTER", "REPLICATE", master).Err()
				return fmt.Sprint(err), err == nil
			})
		})
		if err != nil {
			return fail(fmt.Errorf("redisproc: cluster node %s: replicate %s: %w", s.Addr(), master, err))
		}
	}
	if err := c.WaitState(ctx, "ok"); err != nil {
		return fail(err)
	}
	if err := c.WaitSynced(ctx); err != nil {
		return fail(err)
	}
	return c, nil
}

// poll calls cond at once and then every 10 ms until it reports true; it
// returns ctx's error with cond's last note when ctx ends first.
func poll(ctx context.Context, cond func() (note string, ok bool)) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		note, ok := cond()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w; last: %s", ctx.Err(), note)
		case <-t.C:
		}
	}
}

// withClient runs f with a short-lived plain client of s.
func withClient(ctx context.Context, s *Server, f func(*redis.Client) error) error {
	rc := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, PoolSize: 1, DisableIdentity: true, Protocol: 2})
	defer rc.Close()
	return f(rc)
}

// Addrs returns the nodes' "127.0.0.1:PORT" addresses in Nodes order.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		out[i] = s.Addr()
	}
	return out
}

// URL returns "redis+cluster://ADDR1,ADDR2,…/" (the URL scheme redisq's
// NewClient takes for a cluster).
func (c *Cluster) URL() string { return "redis+cluster://" + strings.Join(c.Addrs(), ",") + "/" }

// NodeFor returns the node that serves key now (CLUSTER KEYSLOT and
// CLUSTER SHARDS, asked of the first running node), and the slot.
func (c *Cluster) NodeFor(ctx context.Context, key string) (*Server, int, error) {
	for _, s := range c.Nodes {
		if !s.Running() {
			continue
		}
		var node *Server
		var slot int
		err := withClient(ctx, s, func(rc *redis.Client) error {
			n, err := rc.ClusterKeySlot(ctx, key).Result()
			if err != nil {
				return err
			}
			slot = int(n)
			addr, _, err := slotOwner(ctx, rc, slot)
			if err != nil {
				return err
			}
			node = c.byAddr(addr)
			if node == nil {
				return fmt.Errorf("slot %d is served by %s, not a node of this cluster", slot, addr)
			}
			return nil
		})
		if err != nil {
			return nil, 0, fmt.Errorf("redisproc: node for %q: %w", key, err)
		}
		return node, slot, nil
	}
	return nil, 0, errors.New("redisproc: no cluster node is running")
}

// slotOwner returns the address and node id of the master serving slot
// as rc's node sees it (CLUSTER SHARDS); an error when none does.
func slotOwner(ctx context.Context, rc *redis.Client, slot int) (addr, id string, err error) {
	shards, err := rc.ClusterShards(ctx).Result()
	if err != nil {
		return "", "", err
	}
	for _, sh := range shards {
		for _, r := range sh.Slots {
			if int(r.Start) > slot || slot > int(r.End) {
				continue
			}
			for _, n := range sh.Nodes {
				if n.Role == "master" {
					return net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10)), n.ID, nil
				}
			}
		}
	}
	return "", "", fmt.Errorf("slot %d has no master", slot)
}

// byAddr returns the node at addr, nil when none is.
func (c *Cluster) byAddr(addr string) *Server {
	for _, s := range c.Nodes {
		if s.Addr() == addr {
			return s
		}
	}
	return nil
}

// WaitState waits until every running node's CLUSTER INFO reports
// cluster_state:want ("ok" or "fail"), and for "ok" also that it knows all
// the nodes (cluster_known_nodes) and that every slot is assigned
// (cluster_slots_assigned), polling every 10 ms. It returns ctx's error,
// with the last CLUSTER INFO that did not match, when ctx ends first.
func (c *Cluster) WaitState(ctx context.Context, want string) error {
	if err := poll(ctx, func() (string, bool) { return c.stateIs(ctx, want) }); err != nil {
		return fmt.Errorf("redisproc: cluster state not %s: %w", want, err)
	}
	return nil
}

// stateIs reports whether every running node is in state want (WaitState),
// else the first mismatching node's CLUSTER INFO or error.
func (c *Cluster) stateIs(ctx context.Context, want string) (string, bool) {
	for _, s := range c.Nodes {
		if !s.Running() {
			continue
		}
		var info string
		err := withClient(ctx, s, func(rc *redis.Client) (err error) {
			info, err = rc.ClusterInfo(ctx).Result()
			return err
		})
		if err != nil {
			return s.Addr() + ": " + err.Error(), false
		}
		f := map[string]string{}
		for _, line := range strings.Split(info, "\n") {
			k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
			f[k] = v
		}
		if f["cluster_state"] != want {
			return s.Addr() + ": " + info, false
		}
		if want == "ok" && (f["cluster_known_nodes"] != strconv.Itoa(len(c.Nodes)) ||
			f["cluster_slots_assigned"] != strconv.Itoa(ClusterSlots)) {
			return s.Addr() + ": " + info, false
		}
	}
	return "", true
}

// Close stops and removes every node; it returns the first error.
func (c *Cluster) Close() error {
	var errs []error
	for _, s := range c.Nodes {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}

// SlotMove is one slot's move from one master to another, step by step,
// as redis-cli --cluster reshard does it: StartSlotMove marks the slot
// MIGRATING on its owner and IMPORTING on the target, Migrate moves keys
// (MIGRATE, atomic per key), MigrateRest moves the keys left, Finish hands
// the slot over (CLUSTER SETSLOT NODE on every running node). Between the
// steps the cluster answers ASK and TRYAGAIN as during a live reshard.
// Its methods are not meant for concurrent use.
type SlotMove struct {
	c *Cluster
	// Slot is the slot being moved.
	Slot int
	// From is its owner before the move, To its owner after.
	From, To *Server
	toID     string
}

// StartSlotMove starts moving slot from its owner to the node to (which
// must be another master of c).
func (c *Cluster) StartSlotMove(ctx context.Context, slot int, to *Server) (*SlotMove, error) {
	m := &SlotMove{c: c, Slot: slot, To: to}
	var fromID string
	for _, s := range c.Nodes {
		if !s.Running() {
			continue
		}
		var addr string
		err := withClient(ctx, s, func(rc *redis.Client) (err error) {
			addr, fromID, err = slotOwner(ctx, rc, slot)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("redisproc: slot %d: %w", slot, err)
		}
		m.From = c.byAddr(addr)
		break
	}
	if m.From == nil || m.From == to {
		return nil, fmt.Errorf("redisproc: slot %d: owner %v, target %s: nothing to move", slot, m.From, to.Addr())
	}
	err := withClient(ctx, to, func(rc *redis.Client) (err error) {
		if m.toID, err = rc.ClusterMyID(ctx).Result(); err != nil {
			return err
		}
		return rc.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", fromID).Err()
	})
	if err == nil {
		err = withClient(ctx, m.From, func(rc *redis.Client) error {
			return rc.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", m.toID).Err()
		})
	}
	if err != nil {
		return nil, fmt.Errorf("redisproc: start moving slot %d: %w", slot, err)
	}
	return m, nil
}

// Migrate moves keys (of the slot) to the target: one MIGRATE … KEYS.
func (m *SlotMove) Migrate(ctx context.Context, keys ...string) error {
	if len(keys) == 0 {
		return nil
	}
	args := []any{"MIGRATE", "127.0.0.1", m.To.Port(), "", 0, 5000, "KEYS"}
	for _, k := range keys {
		args = append(args, k)
	}
	err := withClient(ctx, m.From, func(rc *redis.Client) error { return rc.Do(ctx, args...).Err() })
	if err != nil {
		return fmt.Errorf("redisproc: migrate %v: %w", keys, err)
	}
	return nil
}

// MigrateRest moves every key of the slot still on the source, 100 at a
// time.
func (m *SlotMove) MigrateRest(ctx context.Context) error {
	for {
		var keys []string
		err := withClient(ctx, m.From, func(rc *redis.Client) (err error) {
			keys, err = rc.ClusterGetKeysInSlot(ctx, m.Slot, 100).Result()
			return err
		})
		if err != nil {
			return fmt.Errorf("redisproc: keys of slot %d: %w", m.Slot, err)
		}
		if len(keys) == 0 {
			return nil
		}
		if err := m.Migrate(ctx, keys...); err != nil {
			return err
		}
	}
}

// Finish hands the slot over to the target: CLUSTER SETSLOT NODE on the
// target, the source, then every other running master.
func (m *SlotMove) Finish(ctx context.Context) error {
	for _, s := range append([]*Server{m.To, m.From}, m.c.Nodes...) {
		if !s.Running() {
			continue
		}
		// Replicas take SETSLOT from no one but learn the owner from
		// their master.
		if r, err := m.c.Role(ctx, s); err != nil {
			return err
		} else if !r.Master {
			continue
		}
		err := withClient(ctx, s, func(rc *redis.Client) error {
			return rc.Do(ctx, "CLUSTER", "SETSLOT", m.Slot, "NODE", m.toID).Err()
		})
		if err != nil {
			return fmt.Errorf("redisproc: hand slot %d over on %s: %w", m.Slot, s.Addr(), err)
		}
	}
	return nil
}

// WaitSettled waits until the cluster has settled after a fault: every
// running node reports cluster_state:ok (WaitState), every running node
// sees the same master for every slot (CLUSTER SHARDS), and each of those
// masters says it is a master (its own CLUSTER NODES). A node resumed
// after a pause long enough to be failed over still claims its slots for
// a moment before it learns it was replaced; an operator action (a slot
// move, a failover) begun then may hand a slot to a node about to turn
// replica and leave it unserved. It polls every 10 ms and returns ctx's
// error, with the last disagreement, when ctx ends first.
func (c *Cluster) WaitSettled(ctx context.Context) error {
	err := poll(ctx, func() (string, bool) {
		if note, ok := c.stateIs(ctx, "ok"); !ok {
			return note, false
		}
		var first map[string]string // "start-end" → master's address
		var firstAddr string
		for _, s := range c.Nodes {
			if !s.Running() {
				continue
			}
			owners := map[string]string{}
			err := withClient(ctx, s, func(rc *redis.Client) error {
				shards, err := rc.ClusterShards(ctx).Result()
				if err != nil {
					return err
				}
				for _, sh := range shards {
					for _, n := range sh.Nodes {
						if n.Role != "master" {
							continue
						}
						for _, r := range sh.Slots {
							owners[fmt.Sprintf("%d-%d", r.Start, r.End)] = net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10))
						}
					}
				}
				return nil
			})
			if err != nil {
				return s.Addr() + ": " + err.Error(), false
			}
			if first == nil {
				first, firstAddr = owners, s.Addr()
				continue
			}
			if !maps.Equal(first, owners) {
				return fmt.Sprintf("%s sees masters %v, %s sees %v", firstAddr, first, s.Addr(), owners), false
			}
		}
		for _, addr := range first {
			m := c.byAddr(addr)
			if m == nil || !m.Running() {
				return "slot master " + addr + " is not a running node", false
			}
			r, err := c.Role(ctx, m)
			if err != nil {
				return err.Error(), false
			}
			if !r.Master {
				return addr + " is named master but says it is a replica", false
			}
		}
		return "", true
	})
	if err != nil {
		return fmt.Errorf("redisproc: cluster not settled: %w", err)
	}
	return nil
}
