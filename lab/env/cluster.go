package env

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/chat/schema"
	"github.com/outboxchat/outboxchat/internal/redisproc"
	"github.com/outboxchat/outboxchat/lab/fault"
)

// The lab's Redis Cluster (Options.RedisCluster).
const (
	// ClusterMasters is the number of masters, each with one replica.
	ClusterMasters = 3
	// ClusterNodeTimeout is the lab cluster's cluster-node-timeout: a
	// master killed is replaced by its replica about two to three times
	// this after the kill.
	ClusterNodeTimeout = time.Second
)

// startCluster starts the Redis Cluster of Options.RedisCluster with the
// servers' options rdOpts (its ACL file) and sets e.RedisCluster and
// e.Redis (its first node).
func (e *Env) startCluster(ctx context.Context, opts Options, rdOpts redisproc.Options, progress io.Writer) error {
	if opts.Sentinel || opts.TLS {
		return errors.New("lab: a Redis Cluster with sentinels or TLS is not supported")
	}
	fmt.Fprintf(progress, "lab: starting a private Redis Cluster (%d masters, %d replicas)\n", ClusterMasters, ClusterMasters)
	rdOpts.ClusterReplicas, rdOpts.ClusterNodeTimeout = 1, ClusterNodeTimeout
	c, err := redisproc.StartCluster(ctx, ClusterMasters, &rdOpts)
	if err != nil {
		return err
	}
	e.RedisCluster, e.Redis = c, c.Nodes[0]
	return nil
}

// clusterUser applies the ACL rules args (schema.RedisACL) on every node
// of the cluster, replicas too: ACL users are not replicated, and a
// replica a failover promotes needs them.
func (e *Env) clusterUser(ctx context.Context, args []string) error {
	for _, s := range e.RedisCluster.Nodes {
		rc := redis.NewClient(&redis.Options{Addr: s.Addr()})
		err := schema.ApplyRedisACL(ctx, rc, args)
		rc.Close()
		if err != nil {
			return fmt.Errorf("lab: redis user on cluster node %s: %w", s.Addr(), err)
		}
	}
	return nil
}

// Pauses of the cluster faults (injectCluster).
const (
	// clusterSyncPause bounds how long a ClusterFailover pauses the
	// master's writes while its replica catches up, before the kill.
	clusterSyncPause = 5 * time.Second
	// clusterKeyPause is the pause between two keys a ClusterReshard
	// migrates.
	clusterKeyPause = 20 * time.Millisecond
)

// injectCluster is Inject for the Redis Cluster kinds.
func (e *Env) injectCluster(ctx context.Context, f fault.Fault) (Heal, error) {
	none := func(context.Context) error { return nil }
	c := e.RedisCluster
	if c == nil {
		return none, fmt.Errorf("lab: inject %s: the environment has no Redis Cluster", f.Kind)
	}
	// An operator moves a slot or fails a master over on a settled
	// cluster: begun while a resumed node still claims slots it lost, a
	// move could hand its slot to a node about to turn replica.
	if f.Kind != fault.ClusterPause {
		if err := c.WaitSettled(ctx); err != nil {
			return none, fmt.Errorf("lab: inject %s: %w", f.Kind, err)
		}
	}
	node, slot, err := c.NodeFor(ctx, QueueKeys(f.Target).Stream)
	if err != nil {
		return none, fmt.Errorf("lab: inject %s: %w", f.Kind, err)
	}
	switch f.Kind {
	case fault.ClusterPause:
		if err := node.Pause(); err != nil {
			return none, fmt.Errorf("lab: pause cluster node %s: %w", node.Addr(), err)
		}
		// Healed once the cluster has settled: paused past the node
		// timeout, the node was failed over and turns replica on resuming.
		return func(ctx context.Context) error {
			if err := node.Resume(); err != nil {
				return err
			}
			return c.WaitSettled(ctx)
		}, nil
	case fault.ClusterFailover:
		fo, err := c.StartFailover(ctx, node)
		if err == nil {
			err = c.WaitSynced(ctx)
		}
		if err == nil {
			err = fo.SyncReplica(ctx, clusterSyncPause)
		}
		if err != nil {
			return none, fmt.Errorf("lab: inject %s: %w", f.Kind, err)
		}
		rejoin := func(ctx context.Context) error {
			if fo.Master.Running() {
				return nil
			}
			return fo.Rejoin(ctx)
		}
		if err := fo.KillMaster(ctx); err != nil {
			return rejoin, fmt.Errorf("lab: inject %s: %w", f.Kind, err)
		}
		return rejoin, nil
	case fault.ClusterReshard:
		ms, err := c.Masters(ctx)
		if err != nil {
			return none, fmt.Errorf("lab: inject %s: %w", f.Kind, err)
		}
		var to *redisproc.Server
		for _, m := range ms {
			if m != node {
				to = m
				break
			}
		}
		if to == nil {
			return none, fmt.Errorf("lab: inject %s: no other master", f.Kind)
		}
		_, err = MoveSlotKeyByKey(ctx, c, slot, to, clusterKeyPause)
		return none, err
	}
	return none, fmt.Errorf("lab: inject: %q is not a cluster fault", f.Kind)
}

// MoveSlotKeyByKey moves slot to the master to as a live reshard does:
// the slot marked migrating and importing, its keys migrated one at a time
// with pause between two, then handed over. It returns how many keys it
// migrated one by one.
func MoveSlotKeyByKey(ctx context.Context, c *redisproc.Cluster, slot int, to *redisproc.Server, pause time.Duration) (int, error) {
	m, err := c.StartSlotMove(ctx, slot, to)
	if err != nil {
		return 0, err
	}
	from := redis.NewClient(&redis.Options{Addr: m.From.Addr()})
	defer from.Close()
	n := 0
	for {
		keys, err := from.ClusterGetKeysInSlot(ctx, slot, 1).Result()
		if err != nil {
			return n, fmt.Errorf("lab: keys of slot %d: %w", slot, err)
		}
		if len(keys) == 0 {
			break
		}
		if err := m.Migrate(ctx, keys[0]); err != nil {
			return n, err
		}
		n++
		if err := SleepUntil(ctx, time.Now().Add(pause)); err != nil {
			return n, err
		}
	}
	if err := m.MigrateRest(ctx); err != nil {
		return n, err
	}
	return n, m.Finish(ctx)
}
