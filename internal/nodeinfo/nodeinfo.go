// Package nodeinfo reads what redisq checks on the Redis nodes a client
// talks to: their durability settings (appendonly, maxmemory-policy), by
// CONFIG GET or, where CONFIG is refused (a least-privilege ACL user), by
// INFO; and how many replicas of each master are in sync. It judges
// nothing: whether settings are safe is the caller's to say.
package nodeinfo

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Durability is one node's settings: "appendonly" ("yes" or "no") and
// "maxmemory-policy" (e.g. "noeviction").
type Durability struct {
	AppendOnly, MaxMemoryPolicy string
}

// ReadDurability reads c's settings: by CONFIG GET, else, when the server
// refuses CONFIG (an error reply), by INFO persistence and INFO memory
// (aof_enabled, maxmemory_policy). known is false, with a nil error, when
// INFO is refused too. A connection error is returned wrapped.
func ReadDurability(ctx context.Context, c redis.Cmdable) (d Durability, known bool, err error) {
	vals := map[string]string{}
	for _, name := range []string{"appendonly", "maxmemory-policy"} {
		got, err := c.ConfigGet(ctx, name).Result()
		if err != nil {
			var rerr redis.Error
			if errors.As(err, &rerr) {
				d, err := fromInfo(ctx, c)
				return d, err == nil, nil
			}
			return Durability{}, false, fmt.Errorf("checking durability: config get %s: %w", name, err)
		}
		vals[name] = got[name]
	}
	return Durability{AppendOnly: vals["appendonly"], MaxMemoryPolicy: vals["maxmemory-policy"]}, true, nil
}

// fromInfo reads appendonly and maxmemory-policy from INFO.
func fromInfo(ctx context.Context, c redis.Cmdable) (Durability, error) {
	info, err := c.Info(ctx, "persistence", "memory").Result()
	if err != nil {
		return Durability{}, err
	}
	var d Durability
	for _, line := range strings.Split(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		switch k {
		case "aof_enabled":
			d.AppendOnly = map[string]string{"1": "yes", "0": "no"}[v]
		case "maxmemory_policy":
			d.MaxMemoryPolicy = v
		}
	}
	if d.AppendOnly == "" || d.MaxMemoryPolicy == "" {
		return Durability{}, errors.New("INFO lacks aof_enabled or maxmemory_policy")
	}
	return d, nil
}

// Node is one node's settings as EachDurability read them: Addr names the
// node, AppendOnly and MaxMemoryPolicy are "" when they could not be read
// (Err says why; nil Err: the server refused CONFIG and INFO).
type Node struct {
	Addr                        string
	AppendOnly, MaxMemoryPolicy string
	Err                         error
}

// EachDurability reads the settings of every node rdb talks to: each
// master and replica of a *redis.ClusterClient (ForEachShard; sorted by
// address), else the one server. A *redis.Client's node is named by its
// address, or for a Sentinel client ("FailoverClient") by its current
// master's as the master reports it (CLIENT INFO laddr), another client's
// "redis". It never fails as a whole: a node that cannot be read has Err
// set (a cluster none of whose nodes answered is one Node "cluster"). Safe
// for concurrent use.
func EachDurability(ctx context.Context, rdb redis.UniversalClient) []Node {
	read := func(ctx context.Context, c redis.Cmdable, addr string) Node {
		d, _, err := ReadDurability(ctx, c)
		return Node{Addr: addr, AppendOnly: d.AppendOnly, MaxMemoryPolicy: d.MaxMemoryPolicy, Err: err}
	}
	switch c := rdb.(type) {
	case *redis.Client:
		addr := c.Options().Addr
		if addr == "FailoverClient" {
			if ci, err := c.ClientInfo(ctx).Result(); err == nil && ci.LAddr != "" {
				addr = ci.LAddr
			}
		}
		return []Node{read(ctx, c, addr)}
	case *redis.ClusterClient:
		var mu sync.Mutex
		var out []Node
		err := c.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error {
			d := read(ctx, n, n.Options().Addr)
			mu.Lock()
			out = append(out, d)
			mu.Unlock()
			return nil
		})
		if err != nil && len(out) == 0 {
			return []Node{{Addr: "cluster", Err: err}}
		}
		slices.SortFunc(out, func(a, b Node) int { return strings.Compare(a.Addr, b.Addr) })
		return out
	}
	return []Node{read(ctx, rdb, "redis")}
}

// ReplicasInSync returns, per master rdb writes to, how many of its
// replicas are in sync (INFO replication: a connected replica whose state
// is online): every master of a *redis.ClusterClient, keyed by its
// address, else the one server, keyed "redis". A master that cannot be
// read is left out and its error ("replicas of <addr>: …") joined into
// err. Safe for concurrent use.
func ReplicasInSync(ctx context.Context, rdb redis.UniversalClient) (map[string]int, error) {
	out := map[string]int{}
	var mu sync.Mutex
	var errs []error
	read := func(ctx context.Context, c redis.Cmdable, addr string) {
		info, err := c.Info(ctx, "replication").Result()
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			errs = append(errs, fmt.Errorf("replicas of %s: %w", addr, err))
			return
		}
		n := 0
		for _, line := range strings.Split(info, "\n") {
			if strings.HasPrefix(line, "slave") && strings.Contains(line, ":ip=") && strings.Contains(line, ",state=online,") {
				n++
			}
		}
		out[addr] = n
	}
	if c, ok := rdb.(*redis.ClusterClient); ok {
		err := c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			read(ctx, n, n.Options().Addr)
			return nil
		})
		if err != nil {
			errs = append(errs, err)
		}
	} else {
		read(ctx, rdb, "redis")
	}
	return out, errors.Join(errs...)
}
