package redisproc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterSlots is the number of hash slots of a Redis Cluster.
const ClusterSlots = 16384

// Cluster is a private Redis Cluster of masters without replicas, each a
// Server started with Options.Cluster, the slots split evenly between them
// in Nodes order. All methods are safe for concurrent use.
type Cluster struct {
	// Nodes are the masters; Nodes[i] first serves the i-th of len(Nodes)
	// equal ranges of slots.
	Nodes []*Server
}

// StartCluster starts n (≥ 1) cluster nodes with opts (Port and Dir must be
// unset; Cluster is implied), joins them (CLUSTER MEET on their bus ports),
// assigns the slots (CLUSTER ADDSLOTSRANGE) and waits until every node
// reports cluster_state:ok and knows every slot's owner. ctx bounds the
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
	o.Cluster = true
	c := &Cluster{}
	fail := func(err error) (*Cluster, error) {
		_ = c.Close()
		return nil, err
	}
	for range n {
		s, err := Start(ctx, &o)
		if err != nil {
			return fail(err)
		}
		c.Nodes = append(c.Nodes, s)
	}
	for i, s := range c.Nodes {
		err := withClient(ctx, s, func(rc *redis.Client) error {
			if i > 0 {
				first := c.Nodes[0]
				if err := rc.Do(ctx, "CLUSTER", "MEET", "127.0.0.1", first.Port(), first.BusPort()).Err(); err != nil {
					return fmt.Errorf("cluster meet: %w", err)
				}
			}
			lo, hi := i*ClusterSlots/n, (i+1)*ClusterSlots/n-1
			return rc.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err()
		})
		if err != nil {
			return fail(fmt.Errorf("redisproc: cluster node %s: %w", s.Addr(), err))
		}
	}
	if err := c.WaitState(ctx, "ok"); err != nil {
		return fail(err)
	}
	return c, nil
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
			shards, err := rc.ClusterShards(ctx).Result()
			if err != nil {
				return err
			}
			for _, sh := range shards {
				for _, r := range sh.Slots {
					if int(r.Start) > slot || slot > int(r.End) {
						continue
					}
					for _, n := range sh.Nodes {
						if n.Role == "master" {
							node = c.byAddr(net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10)))
						}
					}
				}
			}
			if node == nil {
				return fmt.Errorf("slot %d has no known owner", slot)
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
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		last, ok := c.stateIs(ctx, want)
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redisproc: cluster state not %s: %w; last: %s", want, ctx.Err(), last)
		case <-t.C:
		}
	}
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
