// Package replicawait runs a Redis script and then WAIT for the master's
// replicas on the same connection, so that the script's writes are known
// to be on that many replicas before the caller counts them done: Redis
// replicates asynchronously, and a failover may promote a replica that had
// not got a write the master acknowledged. On a Redis Cluster the call
// goes to the master of the keys' slot, following an ASK once.
package replicawait

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNotReplicated is wrapped by Run's error when fewer replicas than
// Call.Replicas acknowledged within Call.Timeout, or the wait itself
// failed: the master has the writes, but a failover may lose them.
var ErrNotReplicated = errors.New("redisq: add not acknowledged by enough replicas")

// margin is kept between a wait for replicas and the call's ctx deadline,
// so that the wait's own reply, not the deadline, ends it.
const margin = 50 * time.Millisecond

// Call is one script call to be replicated.
type Call struct {
	// Script runs with Keys and Args (EVALSHA; EVAL after NOSCRIPT).
	Script *redis.Script
	Keys   []string
	Args   []any
	// Touch is a hash, in Keys' slot, whose field "" is set to "" between
	// the script and the WAIT: a write that always reaches the replicas,
	// so that a call whose script wrote nothing (all duplicates) still
	// waits for what an earlier call wrote, not only for the connection's
	// own earlier writes.
	Touch string
	// Replicas is how many replicas must acknowledge (> 0); Timeout bounds
	// the wait (millisecond resolution; cut to end 50 ms before ctx's
	// deadline, and at least 1 ms).
	Replicas int
	Timeout  time.Duration
}

// Run runs c on rdb, a *redis.Client (single server or Sentinel) or a
// *redis.ClusterClient, and returns the script's reply. On a cluster it
// runs on the master of Keys[0]'s slot as the client knows it: an ASK (the
// keys are on the node importing the slot) is followed once; a MOVED has
// the client reload the slots' owners; either, if the call ends with it,
// is returned for the caller to retry; a CLUSTERDOWN reply is returned as
// clusterDown makes it. Errors: the script's, the HSET's, the WAIT's
// (wrapping ErrNotReplicated too), ErrNotReplicated (wrapped) when fewer
// replicas acknowledged, or another client type's. Safe for concurrent
// use.
func Run(ctx context.Context, rdb redis.UniversalClient, c Call, clusterDown func(reply error) error) ([]any, error) {
	switch r := rdb.(type) {
	case *redis.Client:
		return c.result(c.addAndWait(ctx, r, false))
	case *redis.ClusterClient:
		return c.runCluster(ctx, r, clusterDown)
	}
	return nil, CheckClient(rdb, c.Timeout)
}

// CheckClient reports whether Run can wait for replicas on rdb with
// timeout: nil for a *redis.Client or *redis.ClusterClient whose read
// timeout, if any, is at least twice timeout (the read deadline covers the
// script's run and the round trip too, and a NOSCRIPT reply costs a second
// wait). Errors name what is wrong.
func CheckClient(rdb redis.UniversalClient, timeout time.Duration) error {
	var read time.Duration
	switch c := rdb.(type) {
	case *redis.Client:
		read = c.Options().ReadTimeout
	case *redis.ClusterClient:
		read = c.Options().ReadTimeout
	default:
		return fmt.Errorf("waiting for replicas needs a *redis.Client or *redis.ClusterClient, not %T", rdb)
	}
	if read > 0 && timeout > read/2 {
		return fmt.Errorf("wait timeout %v above half the client's read timeout %v", timeout, read)
	}
	return nil
}

func (c Call) runCluster(ctx context.Context, cluster *redis.ClusterClient, clusterDown func(error) error) ([]any, error) {
	node, err := cluster.MasterForKey(ctx, c.Keys[0])
	if err != nil {
		return nil, err
	}
	reply, n, err := c.addAndWait(ctx, node, false)
	if redis.HasErrorPrefix(err, "ASK ") {
		// The keys are on the node importing the slot: follow the
		// redirection once, as a cluster client does.
		if f := strings.Fields(err.Error()); len(f) == 3 {
			if to := masterAt(ctx, cluster, f[2]); to != nil {
				reply, n, err = c.addAndWait(ctx, to, true)
			}
		}
	}
	switch {
	case redis.HasErrorPrefix(err, "MOVED "):
		cluster.ReloadState(ctx)
	case redis.HasErrorPrefix(err, "CLUSTERDOWN"):
		return nil, clusterDown(err)
	}
	return c.result(reply, n, err)
}

// result is Run's result for addAndWait's: err, else ErrNotReplicated
// when fewer than c.Replicas acknowledged, else reply.
func (c Call) result(reply []any, n int, err error) ([]any, error) {
	switch {
	case err != nil:
		return nil, err
	case n < c.Replicas:
		return nil, fmt.Errorf("%d of %d replicas acknowledged within %v: %w", n, c.Replicas, c.Timeout, ErrNotReplicated)
	}
	return reply, nil
}

// masterAt is the client of cluster's master at addr ("host:port"), nil
// when the cluster (its slots reloaded first) has none there.
func masterAt(ctx context.Context, cluster *redis.ClusterClient, addr string) *redis.Client {
	var mu sync.Mutex
	var found *redis.Client
	_ = cluster.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		if c.Options().Addr == addr {
			mu.Lock()
			found = c
			mu.Unlock()
		}
		return nil
	})
	return found
}

// addAndWait sends the script (by EVALSHA; by EVAL after a NOSCRIPT), the
// HSET of Touch and WAIT in one pipeline on node, each command after
// ASKING when asking (a cluster's ASK redirection), and returns the
// script's reply and how many replicas acknowledged. err is the script's
// error, else the HSET's, else the WAIT's (wrapping ErrNotReplicated too:
// the writes are done, but not known to be replicated).
func (c Call) addAndWait(ctx context.Context, node *redis.Client, asking bool) ([]any, int, error) {
	timeout := c.Timeout
	if d, ok := ctx.Deadline(); ok {
		// WAIT 0 would wait for ever: at least 1 ms.
		timeout = max(min(timeout, time.Until(d)-margin), time.Millisecond)
	}
	var reply []any
	var set *redis.IntCmd
	var wait *redis.Cmd
	for _, load := range []bool{false, true} {
		pipe := node.Pipeline()
		if asking {
			pipe.Do(ctx, "asking")
		}
		var run *redis.Cmd
		if load {
			run = c.Script.Eval(ctx, pipe, c.Keys, c.Args...)
		} else {
			run = c.Script.EvalSha(ctx, pipe, c.Keys, c.Args...)
		}
		if asking {
			pipe.Do(ctx, "asking")
		}
		set = pipe.HSet(ctx, c.Touch, "", "")
		wait = pipe.Do(ctx, "wait", c.Replicas, timeout.Milliseconds())
		_, _ = pipe.Exec(ctx)
		var err error
		if reply, err = run.Slice(); err == nil {
			break
		} else if load || !redis.HasErrorPrefix(err, "NOSCRIPT") {
			return nil, 0, err
		}
	}
	if err := set.Err(); err != nil {
		return nil, 0, fmt.Errorf("rewriting %s before the wait for replicas: %w", c.Touch, err)
	}
	n, err := wait.Int()
	if err != nil {
		return nil, 0, fmt.Errorf("waiting for %d replicas: %w: %w", c.Replicas, ErrNotReplicated, err)
	}
	return reply, n, nil
}
