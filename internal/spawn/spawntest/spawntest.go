// Package spawntest is what the tests of the private servers (pgproc,
// redisproc, natsproc) share: starting a server for one test, and checking
// the Close that spawn.Server gives them all.
package spawntest

import (
	"context"
	"os"
	"testing"
)

// Start calls start with t's context and opts, fails t on error, and
// closes the server when t ends.
func Start[S interface{ Close() error }, O any](t testing.TB, start func(context.Context, *O) (S, error), opts *O) S {
	t.Helper()
	s, err := start(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// Closable is a private server's part that CheckClose checks.
type Closable interface {
	Dir() string
	Close() error
	Restart(ctx context.Context) error
}

// CheckClose closes s, a server with a temp dir of its own, twice (the
// second Close is a no-op and returns nil), and fails t unless both return
// nil, the dir is gone, and a Restart afterwards fails.
func CheckClose(t testing.TB, s Closable) {
	t.Helper()
	dir := s.Dir()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("dir %s not removed: %v", dir, err)
	}
	if err := s.Restart(t.Context()); err == nil {
		t.Fatal("Restart after Close succeeded")
	}
}
