// Package testenv gives this module's tests private PostgreSQL and Redis
// servers, shared per test binary, plus helpers to isolate tests from each
// other on them. The shared servers, databases and keys come from the
// exported test kit, outboxtest (one implementation, which users' tests
// use too); testenv adds the goleak check of Main and PrivatePostgres /
// PrivateRedis, servers of a test's own that it can kill and restart.
//
// Use it from TestMain:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
//
// The shared servers are started lazily on first use (Database, Pool,
// RedisURL, Redis) on free ports in temp dirs; the system servers on
// 5432/6379 are never used. Set TEST_DATABASE_URL (postgres:// URL of a
// superuser on any database) or TEST_REDIS_URL to use existing servers
// instead. Every function here is safe for concurrent use, including from
// parallel tests, but like t.Fatal must be called from the test's goroutine.
package testenv

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/outboxchat/outboxchat/internal/natsproc"
	"github.com/outboxchat/outboxchat/internal/pgproc"
	"github.com/outboxchat/outboxchat/internal/redisproc"
	"github.com/outboxchat/outboxchat/outboxtest"
)

// Environment variables that point tests at existing servers (the same as
// outboxtest's).
const (
	// EnvDatabaseURL names a postgres:// URL of a superuser; Database
	// creates its databases on that server instead of a private one.
	EnvDatabaseURL = outboxtest.EnvDatabaseURL
	// EnvRedisURL names a redis:// URL used instead of a private Redis.
	EnvRedisURL = outboxtest.EnvRedisURL
)

const startTimeout = 60 * time.Second

var logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

// leakIgnores are goroutines that legitimately outlive the tests: the
// process spawner of pgproc/redisproc lives for the whole process by design.
var leakIgnores = []goleak.Option{
	goleak.IgnoreAnyFunction(outboxtest.SpawnerGoroutine),
}

// Main runs the tests with outboxtest.Run (m.Run, then the shared servers
// are stopped and their directories removed), then checks for leaked
// goroutines with goleak (ignoring goroutines that existed when Main was
// called and the process spawner). It exits the process: with m.Run's code,
// or 1 if the tests passed but goroutines leaked or a server failed to
// close. Call it from TestMain; the shared servers require it (or
// outboxtest.Main), else Database/RedisURL fail the test.
func Main(m *testing.M) {
	opts := append([]goleak.Option{goleak.IgnoreCurrent()}, leakIgnores...)
	code := outboxtest.Run(m)
	if err := closeBouncer(); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: close pgbouncer: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	if code == 0 {
		if err := goleak.Find(opts...); err != nil {
			fmt.Fprintf(os.Stderr, "testenv: goroutine leak after tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Database is outboxtest.DatabaseURL(t) with no schema: a fresh, empty
// database named t_<random> on the shared private Postgres server (or on
// TEST_DATABASE_URL's server), dropped WITH (FORCE) at t.Cleanup; it returns
// a superuser URL for it.
func Database(t testing.TB) string {
	t.Helper()
	return outboxtest.DatabaseURL(t)
}

// Pool is outboxtest.Pool(t) with no schema: a *pgxpool.Pool (default
// settings) on a fresh Database(t), closed at t.Cleanup before the database
// is dropped.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return outboxtest.Pool(t)
}

// RedisURL is outboxtest.RedisURL: the URL ("redis://127.0.0.1:PORT/0") of
// the shared private Redis server, or TEST_REDIS_URL if set. Isolate keys
// with Prefix(t), and do not FLUSHALL.
func RedisURL(t testing.TB) string {
	t.Helper()
	return outboxtest.RedisURL(t)
}

// Prefix is outboxtest.Prefix: a key prefix unique to this call, e.g.
// "t12-9f3a2c1b:".
func Prefix(t testing.TB) string {
	t.Helper()
	return outboxtest.Prefix(t)
}

// Redis is outboxtest.Redis: a *redis.Client (default settings) on
// RedisURL(t), closed at t.Cleanup.
func Redis(t testing.TB) *redis.Client {
	t.Helper()
	return outboxtest.Redis(t)
}

// PrivatePostgres starts a dedicated Postgres server (pgproc defaults: temp
// dir, free port, fsync off, database "outboxchat") for this test alone, for
// tests that Kill/Stop/Restart it. It is closed and its dir removed at
// t.Cleanup. It does not need Main. The first Postgres start in a process
// runs initdb (about a second); later ones copy a template cluster.
func PrivatePostgres(t testing.TB) *pgproc.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	s, err := pgproc.Start(ctx, &pgproc.Options{Logger: logger})
	if err != nil {
		t.Fatalf("testenv: start private postgres: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("testenv: close private postgres: %v", err)
		}
	})
	return s
}

// PrivateRedis starts a dedicated Redis server (redisproc defaults: temp dir,
// free port, AOF everysec) for this test alone, for tests that
// Kill/Stop/Restart it. It is closed and its dir removed at t.Cleanup. It
// does not need Main.
func PrivateRedis(t testing.TB) *redisproc.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	s, err := redisproc.Start(ctx, &redisproc.Options{Logger: logger})
	if err != nil {
		t.Fatalf("testenv: start private redis: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("testenv: close private redis: %v", err)
		}
	})
	return s
}

// PrivateNATS starts a dedicated nats-server with JetStream (natsproc
// defaults: temp dir, free port) for this test alone, closed and its dir
// removed at t.Cleanup. The test fails (t.Fatal) when no nats-server is
// installed (scripts/install-deps.sh --test installs it) or it cannot
// start. It does not need Main.
func PrivateNATS(t testing.TB) *natsproc.Server {
	t.Helper()
	if err := natsproc.Available(); err != nil {
		t.Fatalf("testenv: %v (scripts/install-deps.sh --test installs nats-server)", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	s, err := natsproc.Start(ctx, &natsproc.Options{Logger: logger})
	if err != nil {
		t.Fatalf("testenv: start private nats-server: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("testenv: close private nats-server: %v", err)
		}
	})
	return s
}

// RedisCluster starts a private Redis Cluster of n masters of the test's
// own (redisproc.StartCluster: free loopback ports, cluster_state:ok on
// every node before it returns), closed when the test ends. The test fails
// (t.Fatal) when the cluster cannot start.
func RedisCluster(t testing.TB, n int) *redisproc.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	c, err := redisproc.StartCluster(ctx, n, &redisproc.Options{Logger: logger})
	if err != nil {
		t.Fatalf("testenv: start private redis cluster: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("testenv: close private redis cluster: %v", err)
		}
	})
	return c
}

// WaitFor is outboxtest.WaitFor: it calls cond at once and then every 5 ms
// until it returns true, or fails the test with t.Fatalf(msg) once timeout
// has elapsed. Use it instead of sleeps. cond runs on the calling goroutine.
func WaitFor(t testing.TB, timeout time.Duration, msg string, cond func() bool) {
	t.Helper()
	outboxtest.WaitFor(t, timeout, msg, cond)
}
