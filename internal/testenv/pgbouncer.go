package testenv

import (
	"context"
	"net/url"
	"sync"
	"testing"

	"github.com/outboxchat/outboxchat/internal/pgbouncerproc"
)

// bouncer is the shared PgBouncer of the test binary, started by the first
// PgBouncer call and closed by Main.
var bouncer struct {
	mu  sync.Mutex
	s   *pgbouncerproc.Server
	err error
}

// PgBouncer returns the test binary's shared private PgBouncer
// (internal/pgbouncerproc) in transaction mode, in front of the shared
// private Postgres (or TEST_DATABASE_URL's server, which must then trust
// local connections), started on first use and closed by Main after the
// tests. Users postgres, consumers and workers may log in; every database
// is forwarded. Point a URL of Database(t) through it with its Rewrite.
// The test fails (t.Fatal) when pgbouncer cannot start, e.g. when it is
// not installed: scripts/install-deps.sh --test installs it. Safe for concurrent
// use.
func PgBouncer(t testing.TB) *pgbouncerproc.Server {
	t.Helper()
	bouncer.mu.Lock()
	defer bouncer.mu.Unlock()
	if bouncer.s == nil && bouncer.err == nil {
		u, err := url.Parse(Database(t))
		if err != nil {
			t.Fatalf("testenv: pgbouncer: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		defer cancel()
		bouncer.s, bouncer.err = pgbouncerproc.Start(ctx, &pgbouncerproc.Options{
			Upstream: u.Host, Mode: pgbouncerproc.ModeTransaction,
			Users: []string{"postgres", "consumers", "workers"}, Logger: logger,
		})
	}
	if bouncer.err != nil {
		t.Fatalf("testenv: start private pgbouncer: %v", bouncer.err)
	}
	return bouncer.s
}

// closeBouncer closes the shared PgBouncer if one was started.
func closeBouncer() error {
	bouncer.mu.Lock()
	defer bouncer.mu.Unlock()
	if bouncer.s == nil {
		return nil
	}
	return bouncer.s.Close()
}
