package natsproc

import (
	"context"
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
