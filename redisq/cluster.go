package redisq

import (
	"context"
	"errors"
	"fmt"
	"net"
	neturl "net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// URL schemes of a Redis Cluster (NewClient, ParseClusterURL).
const (
	// ClusterScheme is a Redis Cluster over plain TCP.
	ClusterScheme = "redis+cluster"
	// ClusterTLSScheme is a Redis Cluster over TLS.
	ClusterTLSScheme = "rediss+cluster"
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
	bad := func(why string, args ...any) error {
		return fmt.Errorf("redisq: cluster url %q: %s", redactURL(url), fmt.Sprintf(why, args...))
	}
	scheme, rest, ok := strings.Cut(url, "://")
	if !ok || (scheme != ClusterScheme && scheme != ClusterTLSScheme) {
		return nil, bad("want %s://host:port[,host:port…]/", ClusterScheme)
	}
	rest, query, _ := strings.Cut(rest, "?")
	var user string
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		user, rest = rest[:at+1], rest[at+1:]
	}
	hosts, path, _ := strings.Cut(rest, "/")
	if path != "" && path != "0" {
		return nil, bad("a cluster has database 0 only, not %q", path)
	}
	var addrs []string
	for _, h := range strings.Split(hosts, ",") {
		if h == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(h); err != nil {
			h = net.JoinHostPort(strings.Trim(h, "[]"), "6379")
		}
		addrs = append(addrs, h)
	}
	if len(addrs) == 0 {
		return nil, bad("no node address")
	}
	q, err := neturl.ParseQuery(query)
	if err != nil {
		return nil, bad("%v", err)
	}
	caFile := q.Get(TLSCAFileParam)
	q.Del(TLSCAFileParam)
	for _, a := range addrs[1:] {
		q.Add("addr", a)
	}
	plain := "redis"
	if scheme == ClusterTLSScheme {
		plain = "rediss"
	}
	opt, err := redis.ParseClusterURL(plain + "://" + user + addrs[0] + "?" + q.Encode())
	if err != nil {
		return nil, bad("%v", err)
	}
	if caFile != "" && opt.TLSConfig == nil {
		return nil, bad("%s needs %s://", TLSCAFileParam, ClusterTLSScheme)
	}
	if err := setCAFile(opt.TLSConfig, caFile); err != nil {
		return nil, err
	}
	return opt, nil
}

// redactURL hides the password of a user:password@ URL in errors.
func redactURL(url string) string {
	scheme, rest, ok := strings.Cut(url, "://")
	if !ok {
		return url
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return url
	}
	user, _, hasPass := strings.Cut(rest[:at], ":")
	if !hasPass {
		return url
	}
	return scheme + "://" + user + ":xxxxx@" + rest[at+1:]
}

// newClusterClient is NewClientPool for a cluster url; grow sets the
// per-node pool size.
func newClusterClient(url string, grow func(*int)) (*redis.ClusterClient, error) {
	opt, err := ParseClusterURL(url)
	if err != nil {
		return nil, err
	}
	failFast(&opt.MaxRetries, &opt.DialerRetries, &opt.DialTimeout, &opt.ReadTimeout, &opt.WriteTimeout,
		&opt.PoolTimeout, &opt.ContextTimeoutEnabled, &opt.DisableIdentity)
	grow(&opt.PoolSize)
	opt.MaxRedirects = ClusterMaxRedirects
	opt.MinRetryBackoff, opt.MaxRetryBackoff = ClusterMinRetryBackoff, ClusterMaxRetryBackoff
	opt.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	c := redis.NewClusterClient(opt)
	reload := func() { c.ReloadState(context.Background()) }
	c.OnNewNode(func(n *redis.Client) { n.AddHook(clusterHook{reload: reload}) })
	return c, nil
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

// clusterHook, on every node of a cluster client, turns a CLUSTERDOWN
// reply to a single command into a *ClusterDownError, which go-redis's
// redirection loop does not retry: a cluster that lost a slot stays down
// for longer than any in-call retry could wait. And it has the client
// reload the slots' owners (reload, asynchronous and coalesced by
// go-redis) on a CLUSTERDOWN reply, a failed dial or a broken connection:
// after a master's failover nothing else tells go-redis that its replica
// now serves the slots (no MOVED comes from a dead node), and it would go
// on dialing the dead master until its periodic reload (a minute).
type clusterHook struct{ reload func() }

func (h clusterHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err != nil {
			h.reload()
		}
		return c, err
	}
}

func (h clusterHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil && redis.HasErrorPrefix(err, "CLUSTERDOWN") {
			h.reload()
			err = &ClusterDownError{Err: err}
			cmd.SetErr(err)
		} else if connectionLost(err) {
			h.reload()
		}
		return err
	}
}

func (h clusterHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
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

// isTryAgain reports whether err is a reply of a slot in migration that
// go-redis gave up on: TRYAGAIN (the keys are split between the two
// nodes), or an ASK or MOVED left over when its redirections ran out
// (ASK and TRYAGAIN alternate while the keys are split).
func isTryAgain(err error) bool {
	if err == nil {
		return false
	}
	for _, p := range []string{"TRYAGAIN", "ASK ", "MOVED "} {
		if redis.HasErrorPrefix(err, p) {
			return true
		}
	}
	return false
}

// tryAgainBudget is TryAgainBudget; the package's tests raise it, so that a
// slot move on a loaded machine does not outlast it.
var tryAgainBudget = TryAgainBudget

// tryAgainWaits are the waits between the retries of retryTryAgain.
const (
	tryAgainFirstWait = 5 * time.Millisecond
	tryAgainMaxWait   = 100 * time.Millisecond
)

// retryTryAgain calls op, and again after a growing wait while it fails
// with TRYAGAIN (isTryAgain), for at most TryAgainBudget and never past ctx: then it
// returns op's last error. Any other result is returned at once.
func retryTryAgain(ctx context.Context, op func() error) error {
	until := time.Now().Add(tryAgainBudget)
	wait := tryAgainFirstWait
	for {
		err := op()
		if !isTryAgain(err) || !waitTryAgain(ctx, until, &wait) {
			return err
		}
	}
}

// waitTryAgain sleeps *wait (then doubles it, up to tryAgainMaxWait) and
// reports true, or reports false at once when the sleep would end past
// until or ctx's deadline, or when ctx ends during it.
func waitTryAgain(ctx context.Context, until time.Time, wait *time.Duration) bool {
	end := time.Now().Add(*wait)
	if d, ok := ctx.Deadline(); end.After(until) || (ok && end.After(d)) {
		return false
	}
	t := time.NewTimer(*wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	}
	*wait = min(2**wait, tryAgainMaxWait)
	return true
}
