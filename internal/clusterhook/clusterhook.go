// Package clusterhook is the go-redis hook on every node of a Redis
// Cluster client that makes the client fail fast and learn failovers: a
// CLUSTERDOWN reply to a single command becomes an error go-redis's
// redirection loop does not retry (a cluster that lost a slot stays down
// for longer than any in-call retry could wait), and a CLUSTERDOWN reply,
// a failed dial or a broken connection has the client reload the slots'
// owners. After a master's failover nothing else tells go-redis that its
// replica now serves the slots (no MOVED comes from a dead node), and it
// would go on dialing the dead master until its periodic reload (a
// minute).
package clusterhook

import (
	"context"
	"errors"
	"net"

	"github.com/redis/go-redis/v9"
)

// Install adds the hook to every node c connects to (OnNewNode).
// clusterDown turns a node's CLUSTERDOWN reply into the error the command
// then returns; it must not unwrap to the reply (go-redis retries what
// does). Call it before c is used.
func Install(c *redis.ClusterClient, clusterDown func(reply error) error) {
	reload := func() { c.ReloadState(context.Background()) }
	c.OnNewNode(func(n *redis.Client) { n.AddHook(hook{reload: reload, down: clusterDown}) })
}

// hook reloads the slots through reload (asynchronous and coalesced by
// go-redis) and wraps CLUSTERDOWN with down.
type hook struct {
	reload func()
	down   func(error) error
}

func (h hook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err != nil {
			h.reload()
		}
		return c, err
	}
}

func (h hook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil && redis.HasErrorPrefix(err, "CLUSTERDOWN") {
			h.reload()
			err = h.down(err)
			cmd.SetErr(err)
		} else if connectionLost(err) {
			h.reload()
		}
		return err
	}
}

func (h hook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if connectionLost(err) || (err != nil && redis.HasErrorPrefix(err, "CLUSTERDOWN")) {
			h.reload()
		}
		return err
	}
}

// connectionLost reports whether err is a network error (the node went
// away), not a reply or the caller's context ending.
func connectionLost(err error) bool {
	var ne net.Error
	return err != nil && errors.As(err, &ne) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}
