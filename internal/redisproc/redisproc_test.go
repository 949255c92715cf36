package redisproc

import (
	"net"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/internal/spawn/spawntest"
)

func client(t *testing.T, s *Server) *redis.Client {
	t.Helper()
	o, err := redis.ParseURL(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { c.Close() })
	return c
}

// start starts a server with opts, closed at the end of the test.
func start(t *testing.T, opts *Options) *Server { return spawntest.Start(t, Start, opts) }

func TestLifecycle(t *testing.T) {
	t.Parallel()
	ctx := t.Context() // Start bounds itself (StartTimeout)
	s := start(t, nil)
	if s.Port() == 6379 || s.Port() == 0 {
		t.Fatalf("bad port %d", s.Port())
	}
	if s.URL() != "redis://127.0.0.1:"+strconv.Itoa(s.Port())+"/0" || s.Addr() != "127.0.0.1:"+strconv.Itoa(s.Port()) {
		t.Fatal(s.URL(), s.Addr())
	}
	c := client(t, s)
	if err := c.Set(ctx, "graceful", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if v, _ := c.ConfigGet(ctx, "appendonly").Result(); v["appendonly"] != "yes" {
		t.Fatalf("appendonly=%v", v)
	}

	// Graceful stop flushes the AOF (appendfsync everysec is irrelevant).
	port := s.Port()
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if s.Running() {
		t.Fatal("running after Stop")
	}
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if s.Port() != port {
		t.Fatal("port changed")
	}
	if v, err := c.Get(ctx, "graceful").Result(); err != nil || v != "1" {
		t.Fatalf("after Stop/Restart: %q %v", v, err)
	}

	// Crash: with appendfsync always every acknowledged write is in the AOF.
	if err := c.ConfigSet(ctx, "appendfsync", "always").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, "crash", "2", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if nc, err := net.Dial("tcp", s.Addr()); err == nil {
		nc.Close()
		t.Fatal("dial succeeded after Kill")
	}
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"graceful", "crash"} {
		if _, err := c.Get(ctx, k).Result(); err != nil {
			t.Fatalf("key %s after Kill/Restart: %v", k, err)
		}
	}

	spawntest.CheckClose(t, s)
}

func TestPortInUse(t *testing.T) {
	t.Parallel()
	ctx := t.Context() // Start bounds itself (StartTimeout)
	s := start(t, nil)
	s2, err := Start(ctx, &Options{Port: s.Port()})
	if err == nil {
		s2.Close()
		t.Fatal("second server on same port started")
	}
	t.Logf("expected error: %v", err)
}

func TestCallerDirKept(t *testing.T) {
	t.Parallel()
	ctx := t.Context() // Start bounds itself (StartTimeout)
	dir := t.TempDir()
	s := start(t, &Options{Dir: dir})
	if err := client(t, s).Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := start(t, &Options{Dir: dir})
	if v, err := client(t, s2).Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("%q %v", v, err)
	}
}
