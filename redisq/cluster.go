package redisq

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/internal/redisclient"
	"github.com/outboxchat/outboxchat/internal/tryagain"
)

// URL schemes of a Redis Cluster (NewClient, ParseClusterURL).
const (
	// ClusterScheme, "redis+cluster", is a Redis Cluster over plain TCP.
	ClusterScheme = redisclient.ClusterScheme
	// ClusterTLSScheme, "rediss+cluster", is a Redis Cluster over TLS.
	ClusterTLSScheme = redisclient.ClusterTLSScheme
)

// Retry bounds of the cluster client returned by NewClient. They bound one
// call: nothing is kept or retried across calls.
const (
	// ClusterMaxRedirects is the most MOVED/ASK redirections and retries
	// (TRYAGAIN, a failed connection) go-redis makes within one command
	// or pipeline.
	ClusterMaxRedirects = 5
	// ClusterMinRetryBackoff and ClusterMaxRetryBackoff bound go-redis's
	// wait before a retry (not before following MOVED or ASK, which is
	// immediate).
	ClusterMinRetryBackoff = 2 * time.Millisecond
	ClusterMaxRetryBackoff = 32 * time.Millisecond
	// TryAgainBudget is the longest a script (or MULTI) of this package
	// keeps retrying TRYAGAIN within one call, on top of go-redis's own
	// retries (and never past the call's ctx deadline); an ASK or MOVED
	// left over when go-redis's redirections ran out counts as TRYAGAIN.
	// A script whose keys are split between two nodes while its slot
	// migrates gets TRYAGAIN until the keys are on one node again or the
	// slot's move completes; a migration longer than this makes the call
	// fail with the TRYAGAIN error, for the caller to retry later.
	TryAgainBudget = 2 * time.Second
)

// ParseClusterURL parses
//
//	redis+cluster://[user:password@]host1:port1[,host2:port2…][/][?param=value&…]
//	rediss+cluster://… (TLS)
//
// e.g. "redis+cluster://10.0.0.1:7000,10.0.0.2:7000/": the addresses of
// some of the cluster's nodes (port default 6379; the others are learnt
// from CLUSTER SLOTS) and the ACL user and password of every node. A path
// other than "", "/" or "/0" is an error (a cluster has database 0 only).
// The query takes go-redis's cluster URL parameters (e.g.
// "?dial_timeout=2s", see redis.ParseClusterURL) and tls_ca_file
// (TLSCAFileParam, rediss+cluster:// only). It returns go-redis's
// ClusterOptions with only those fields set. Errors: a malformed url, no
// address, a database, an unknown parameter, an unreadable tls_ca_file.
func ParseClusterURL(url string) (*redis.ClusterOptions, error) {
	opt, err := redisclient.Cluster(url)
	if err != nil {
		return nil, fmt.Errorf("redisq: %w", err)
	}
	return opt, nil
}

// ErrClusterDown is matched (errors.Is) by the *ClusterDownError of a
// cluster client made by NewClient.
var ErrClusterDown = errors.New("redisq: redis cluster is down")

// ClusterDownError is a node's CLUSTERDOWN reply (the cluster lost a slot's
// every copy, or this node is cut off from the majority), as the cluster
// client of NewClient returns it: at once, not retried. Err is the node's
// reply. It deliberately does not unwrap to Err: go-redis retries what
// unwraps to a CLUSTERDOWN reply.
type ClusterDownError struct {
	// Err is the node's reply ("CLUSTERDOWN The cluster is down", …).
	Err error
}

// Error says the cluster is down and quotes the node's reply.
func (e *ClusterDownError) Error() string { return "redisq: redis cluster is down: " + e.Err.Error() }

// Is reports whether target is ErrClusterDown.
func (e *ClusterDownError) Is(target error) bool { return target == ErrClusterDown }

// tryAgainBudget is TryAgainBudget; the package's tests raise it, so that a
// slot move on a loaded machine does not outlast it.
var tryAgainBudget = TryAgainBudget

// retryTryAgain calls op, and again after a growing wait while it fails
// with TRYAGAIN (or an ASK or MOVED left over), for at most
// tryAgainBudget and never past ctx: then it returns op's last error.
func retryTryAgain(ctx context.Context, op func() error) error {
	return tryagain.Retry(ctx, tryAgainBudget, op)
}
