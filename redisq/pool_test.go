package redisq_test

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/redisq"
)

// NewClientPool raises the pool size of a single-node and a cluster
// client (no connection is made), and keeps a larger pool_size of the url.
func TestNewClientPoolSize(t *testing.T) {
	for _, c := range []struct {
		url  string
		size int
		want int
	}{
		{"redis://127.0.0.1:1/0", 500, 500},
		{"redis://127.0.0.1:1/0?pool_size=900", 500, 900},
		{"redis+cluster://127.0.0.1:1,127.0.0.1:2/", 500, 500},
	} {
		rdb, err := redisq.NewClientPool(c.url, c.size)
		if err != nil {
			t.Fatal(err)
		}
		var got int
		switch r := rdb.(type) {
		case *redis.Client:
			got = r.Options().PoolSize
		case *redis.ClusterClient:
			got = r.Options().PoolSize
		}
		_ = rdb.Close()
		if got != c.want {
			t.Errorf("%s with %d: pool size %d, want %d", c.url, c.size, got, c.want)
		}
	}
}
