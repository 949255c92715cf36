package natsproc

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestStartRestartKill(t *testing.T) {
	if err := Available(); err != nil {
		t.Fatalf("nats-server missing (scripts/install-deps.sh --test installs it): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := Start(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if err := s.ping(ctx); err != nil {
		t.Fatalf("ping after start: %v", err)
	}
	if err := s.Restart(ctx); err != nil {
		t.Fatalf("restart: %v", err)
	}
	if err := s.ping(ctx); err != nil {
		t.Fatalf("ping after restart: %v", err)
	}
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if s.Running() || s.ping(ctx) == nil {
		t.Fatal("killed server still serves")
	}
	if err := s.Start(ctx); err != nil {
		t.Fatalf("start after kill: %v", err)
	}
	if err := s.ping(ctx); err != nil {
		t.Fatalf("ping after start: %v", err)
	}
}

// A three-node cluster elects one meta leader; with one node killed the
// other two still agree on one, and the node started again rejoins them.
func TestClusterElectsAndRejoins(t *testing.T) {
	if err := Available(); err != nil {
		t.Fatalf("nats-server missing (scripts/install-deps.sh --test installs it): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := StartCluster(ctx, 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	leader, err := c.Servers[0].metaLeader(ctx)
	if err != nil || c.Server(leader) == nil {
		t.Fatalf("meta leader %q (%v): not one of the nodes", leader, err)
	}
	if err := c.Server(leader).Kill(); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitReady(ctx); err != nil {
		t.Fatalf("after killing the leader: %v", err)
	}
	var now string
	for _, s := range c.Servers {
		if s.Running() {
			if now, err = s.metaLeader(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if now == leader || c.Server(now) == nil {
		t.Fatalf("meta leader %q after killing %q", now, leader)
	}
	if err := c.Server(leader).Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitReady(ctx); err != nil {
		t.Fatalf("after the node came back: %v", err)
	}
	if !strings.Contains(c.URL(), c.Server(leader).URL()) {
		t.Fatalf("URL %q lacks the node %s", c.URL(), c.Server(leader).URL())
	}
}
