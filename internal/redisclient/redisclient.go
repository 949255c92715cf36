// Package redisclient builds redisq's go-redis clients from a URL: a
// single server ("redis://", "rediss://", "unix://"), a Sentinel-managed
// primary ("redis+sentinel://") or a Redis Cluster ("redis+cluster://",
// "rediss+cluster://"), each with the tls_ca_file parameter of a private
// CA, and with the same fail-fast settings on every connection: no
// retries, one dial attempt, bounded timeouts, ctx deadlines honoured, no
// CLIENT SETINFO and no maintenance-notification handshake. Errors carry
// no package prefix (the caller adds its own) and never a password.
package redisclient

import (
	"cmp"
	"runtime"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/outboxchat/outboxchat/internal/clusterhook"
)

// Settings are what New sets on a client, over the URL's parameters.
type Settings struct {
	// DialTimeout, ReadTimeout, WriteTimeout and PoolTimeout are
	// go-redis's timeouts of the same names (> 0).
	DialTimeout, ReadTimeout, WriteTimeout, PoolTimeout time.Duration
	// PoolSize, when above 0, makes room for at least this many
	// connections per node (go-redis's PoolSize, default 10 per
	// GOMAXPROCS); a larger pool_size in the URL counts.
	PoolSize int
	// MaxRedirects, MinRetryBackoff and MaxRetryBackoff are a cluster
	// client's bounds of one call's redirections and retries.
	MaxRedirects                     int
	MinRetryBackoff, MaxRetryBackoff time.Duration
	// ClusterDown turns a cluster node's CLUSTERDOWN reply into the error
	// its command returns (clusterhook.Install). Required for a cluster
	// URL.
	ClusterDown func(reply error) error
}

// New returns the client of url with s: a *redis.Client, a *redis.Client
// through Sentinel (go-redis's failover client) or a *redis.ClusterClient
// (with clusterhook on every node). The caller owns it and must Close it.
// Errors: those of Single, Sentinel and Cluster.
func New(url string, s Settings) (redis.UniversalClient, error) {
	switch {
	case IsSentinel(url):
		fo, err := Sentinel(url)
		if err != nil {
			return nil, err
		}
		s.failFast(&fo.MaxRetries, &fo.DialerRetries, &fo.DialTimeout, &fo.ReadTimeout, &fo.WriteTimeout,
			&fo.PoolTimeout, &fo.ContextTimeoutEnabled, &fo.DisableIdentity, &fo.PoolSize)
		return redis.NewFailoverClient(fo), nil
	case IsCluster(url):
		opt, err := Cluster(url)
		if err != nil {
			return nil, err
		}
		s.failFast(&opt.MaxRetries, &opt.DialerRetries, &opt.DialTimeout, &opt.ReadTimeout, &opt.WriteTimeout,
			&opt.PoolTimeout, &opt.ContextTimeoutEnabled, &opt.DisableIdentity, &opt.PoolSize)
		opt.MaxRedirects = s.MaxRedirects
		opt.MinRetryBackoff, opt.MaxRetryBackoff = s.MinRetryBackoff, s.MaxRetryBackoff
		opt.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
		c := redis.NewClusterClient(opt)
		clusterhook.Install(c, s.ClusterDown)
		return c, nil
	}
	opt, err := Single(url)
	if err != nil {
		return nil, err
	}
	s.failFast(&opt.MaxRetries, &opt.DialerRetries, &opt.DialTimeout, &opt.ReadTimeout, &opt.WriteTimeout,
		&opt.PoolTimeout, &opt.ContextTimeoutEnabled, &opt.DisableIdentity, &opt.PoolSize)
	opt.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	return redis.NewClient(opt), nil
}

// failFast sets s on the fields of any of go-redis's option types, which
// share the fields but no type: no retries, one dial attempt, the
// timeouts, context deadlines honoured, no CLIENT SETINFO, the pool grown
// to s.PoolSize.
func (s Settings) failFast(maxRetries, dialerRetries *int, dial, read, write, pool *time.Duration, ctxTimeout, noIdentity *bool, poolSize *int) {
	*maxRetries, *dialerRetries = -1, 1
	*dial, *read, *write, *pool = s.DialTimeout, s.ReadTimeout, s.WriteTimeout, s.PoolTimeout
	*ctxTimeout, *noIdentity = true, true
	if s.PoolSize > 0 {
		*poolSize = max(cmp.Or(*poolSize, 10*runtime.GOMAXPROCS(0)), s.PoolSize)
	}
}
