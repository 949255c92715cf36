package natsproc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/outboxchat/outboxchat/internal/spawn"
)

// Cluster is a private JetStream cluster of nats-servers on 127.0.0.1,
// routed to each other, each with its own store (a dir of its own in the
// cluster's) and a monitoring port. Its methods are safe for concurrent use; each Server's
// lifecycle methods kill, stop and start that node alone.
type Cluster struct {
	// Servers are the nodes, in start order.
	Servers []*Server
	dir     string
	own     bool
}

// StartCluster starts n (≥ 3, for a JetStream quorum) nats-servers with
// JetStream as one cluster and waits until every node answers and the
// cluster has elected its meta leader (WaitReady). opts as Start's, Port
// ignored; opts.Dir, when set, holds the nodes' dirs (else a temp dir that
// Close removes). ctx bounds the start. On error nothing is left running.
func StartCluster(ctx context.Context, n int, opts *Options) (*Cluster, error) {
	if n < 3 {
		return nil, fmt.Errorf("natsproc: a JetStream cluster needs 3 nodes or more, not %d", n)
	}
	if opts == nil {
		opts = &Options{}
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	dir, own, err := spawn.Dir("natsproc-cluster", opts.Dir, log)
	if err != nil {
		return nil, err
	}
	// A port picked free may be taken by another process before the node
	// binds it: pick them all again.
	for attempt := 1; ; attempt++ {
		c, err := startCluster(ctx, n, opts, log, dir)
		if err == nil {
			c.own = own != ""
			return c, nil
		}
		if !errors.Is(err, spawn.ErrBind) || attempt == 5 {
			if own != "" {
				_ = os.RemoveAll(dir)
			}
			return nil, err
		}
		log.Info("natsproc: a cluster port was taken; trying other ports", "err", err)
	}
}

// startCluster is one attempt of StartCluster, in dir. On error nothing
// is left running (dir stays).
func startCluster(ctx context.Context, n int, opts *Options, log *slog.Logger, dir string) (*Cluster, error) {
	c := &Cluster{dir: dir}
	var err error
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	name := "natsproc-" + hex.EncodeToString(rnd[:])
	ports := make([][3]int, n) // client, cluster, monitoring
	picked := map[int]bool{}
	for i := range ports {
		for j := range ports[i] {
			for ports[i][j] == 0 || picked[ports[i][j]] {
				if ports[i][j], err = spawn.FreePort(); err != nil {
					return nil, err
				}
			}
			picked[ports[i][j]] = true
		}
	}
	for i := range n {
		var routes []string
		for j := range n {
			if j != i {
				routes = append(routes, "nats://127.0.0.1:"+strconv.Itoa(ports[j][1]))
			}
		}
		nodeOpts := *opts
		nodeOpts.Dir = filepath.Join(c.dir, name+"-"+strconv.Itoa(i))
		s, err := newServer(&nodeOpts, name+"-"+strconv.Itoa(i))
		if err != nil {
			_ = c.Close()
			return nil, err
		}
		s.port, s.life.Port = ports[i][0], ports[i][0]
		s.route = &route{cluster: name, port: ports[i][1], mon: ports[i][2], routes: routes}
		c.Servers = append(c.Servers, s)
	}
	// Together: a node waits for its routes before JetStream is on.
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, s := range c.Servers {
		wg.Go(func() { errs[i] = s.life.Start(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		_ = c.Close()
		return nil, err
	}
	if err := c.WaitReady(ctx); err != nil {
		_ = c.Close()
		return nil, err
	}
	log.Info("natsproc: cluster started", "nodes", n, "url", c.URL())
	return c, nil
}

// URL returns the nodes' client URLs, comma-separated (a NATS client's
// seed list).
func (c *Cluster) URL() string {
	urls := make([]string, len(c.Servers))
	for i, s := range c.Servers {
		urls[i] = s.URL()
	}
	return strings.Join(urls, ",")
}

// Server returns the node named name (a stream's cluster leader, as
// JetStream names it), nil if none.
func (c *Cluster) Server(name string) *Server {
	for _, s := range c.Servers {
		if s.name == name {
			return s
		}
	}
	return nil
}

// WaitReady waits until every running node reports the same JetStream
// meta leader on its monitoring endpoint (/jsz), a running one, or ctx
// ends: after a
// start, or a restart of nodes, streams can be made and used again.
func (c *Cluster) WaitReady(ctx context.Context) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	var last error
	for {
		if last = c.agreed(ctx); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("natsproc: cluster not ready: %w (last: %v)", ctx.Err(), last)
		case <-t.C:
		}
	}
}

// agreed is nil when every running node names one meta leader.
func (c *Cluster) agreed(ctx context.Context) error {
	leader := ""
	for _, s := range c.Servers {
		if !s.Running() {
			continue
		}
		l, err := s.metaLeader(ctx)
		if err != nil {
			return err
		}
		if l == "" || (leader != "" && l != leader) {
			return fmt.Errorf("node %s: meta leader %q, others %q", s.name, l, leader)
		}
		leader = l
	}
	if leader == "" {
		return errors.New("no node running")
	}
	if l := c.Server(leader); l == nil || !l.Running() {
		return fmt.Errorf("the meta leader %s is not running (not yet noticed)", leader)
	}
	return nil
}

// metaLeader reads the JetStream meta leader off a cluster node's /jsz.
func (s *Server) metaLeader(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(s.route.mon)+"/jsz", nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var jsz struct {
		Meta *struct {
			Leader string `json:"leader"`
		} `json:"meta_cluster"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&jsz); err != nil {
		return "", fmt.Errorf("node %s: /jsz: %w", s.name, err)
	}
	if jsz.Meta == nil {
		return "", nil
	}
	return jsz.Meta.Leader, nil
}

// Close stops every node and removes the temp dir StartCluster made.
func (c *Cluster) Close() error {
	var errs []error
	for _, s := range c.Servers {
		errs = append(errs, s.Close())
	}
	if c.own {
		errs = append(errs, os.RemoveAll(c.dir))
	}
	return errors.Join(errs...)
}
