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
