package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/lab/probe"
)

// TestUpRedisCluster: `lab up --redis-cluster --instances 2 --durable`
// runs the services on a private Redis Cluster of 3 masters and 3
// replicas: "redis:" is one node's URL (a node of a cluster that is ok,
// with 3 masters serving slots and 6 nodes), "redis cluster:" the cluster
// URL with the six nodes; a message sent through one instance of
// consumers reaches a client of the other instance of workers.
func TestUpRedisCluster(t *testing.T) {
	t.Parallel()
	u := startUp(t, "token", "--redis-cluster", "--instances", "2", "--durable")
	node, cluster := u.lines["redis"], u.lines["redis cluster"]
	if !strings.HasPrefix(node, "redis://127.0.0.1:") || !strings.HasPrefix(cluster, "redis+cluster://127.0.0.1:") ||
		strings.Count(cluster, ",") != 5 {
		t.Fatalf("redis: %q, redis cluster: %q: want a node's redis:// URL and a redis+cluster:// URL of six nodes", node, cluster)
	}
	if len(u.all["consumers"]) != 2 || len(u.all["workers"]) != 2 {
		t.Fatalf("consumers %v, workers %v: want two each", u.all["consumers"], u.all["workers"])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	o, err := redis.ParseURL(node)
	if err != nil {
		t.Fatal(err)
	}
	rc := redis.NewClient(o)
	defer rc.Close()
	info, err := rc.ClusterInfo(ctx).Result()
	if err != nil || !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_size:3") ||
		!strings.Contains(info, "cluster_known_nodes:6") {
		t.Fatalf("CLUSTER INFO of %s: %v\n%s", node, err, info)
	}
	token := u.lines["token"]
	w := connectWatcher(ctx, t, u.all["workers"][1], 5, token)
	m, err := probe.NewSender(token).Send(ctx, u.all["consumers"][0], 5, "through the cluster")
	if err != nil {
		t.Fatal(err)
	}
	for !w.SeenID(m.ID) {
		select {
		case <-ctx.Done():
			t.Fatalf("message %s not shown on workers: frames %v", m.ID, w.Frames())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
