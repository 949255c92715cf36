// Package testenv gives tests private PostgreSQL and Redis servers, shared
// per test binary, plus helpers to isolate tests from each other on them.
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
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/outboxchat/outboxchat/internal/pgproc"
	"github.com/outboxchat/outboxchat/internal/redisproc"
)

// Environment variables that point tests at existing servers.
const (
	// EnvDatabaseURL names a postgres:// URL of a superuser; Database
	// creates its databases on that server instead of a private one.
	EnvDatabaseURL = "TEST_DATABASE_URL"
	// EnvRedisURL names a redis:// URL used instead of a private Redis.
	EnvRedisURL = "TEST_REDIS_URL"
)

const startTimeout = 60 * time.Second

var (
	mainCalled atomic.Bool
	counter    atomic.Uint64

	pgOnce sync.Once
	pgSrv  *pgproc.Server
	pgURL  string // server-level admin URL on which databases are created
	pgErr  error

	redisOnce sync.Once
	redisSrv  *redisproc.Server
	redisURL  string
	redisErr  error

	logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
)

// leakIgnores are goroutines that legitimately outlive the tests: the
// process spawners of pgproc/redisproc live for the whole process by design.
var leakIgnores = []goleak.Option{
	goleak.IgnoreAnyFunction("github.com/outboxchat/outboxchat/internal/spawn.spawnLoop"),
}

// Main runs the tests (m.Run), then stops the shared servers and removes
// their directories, then checks for leaked goroutines with goleak (ignoring
// goroutines that existed when Main was called and the process spawners of
// pgproc/redisproc). It exits the process: with m.Run's code, or 1 if the
// tests passed but goroutines leaked or a server failed to close. Call it
// from TestMain; the shared servers require it (without it their temp dirs
// would leak, so Database/RedisURL fail the test).
func Main(m *testing.M) {
	opts := append([]goleak.Option{goleak.IgnoreCurrent()}, leakIgnores...)
	mainCalled.Store(true)
	code := m.Run()
	if err := shutdown(); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: closing shared servers: %v\n", err)
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

func shutdown() error {
	var errs []string
	if pgSrv != nil {
		if err := pgSrv.Close(); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if redisSrv != nil {
		if err := redisSrv.Close(); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if err := pgproc.RemoveTemplate(); err != nil {
		errs = append(errs, err.Error())
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

func requireMain(t testing.TB, what string) {
	t.Helper()
	if !mainCalled.Load() {
		t.Fatalf("testenv: %s needs the shared server: call testenv.Main(m) from TestMain (or set %s/%s)", what, EnvDatabaseURL, EnvRedisURL)
	}
}

// serverURL returns the admin URL of the Postgres server on which test
// databases are created, starting the shared server on first use.
func serverURL(t testing.TB) string {
	t.Helper()
	if u := os.Getenv(EnvDatabaseURL); u != "" {
		if !strings.HasPrefix(u, "postgres://") && !strings.HasPrefix(u, "postgresql://") {
			t.Fatalf("testenv: %s must be a postgres:// URL", EnvDatabaseURL)
		}
		return u
	}
	requireMain(t, "Database")
	pgOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		defer cancel()
		pgSrv, pgErr = pgproc.Start(ctx, &pgproc.Options{Logger: logger})
		if pgErr == nil {
			pgURL = pgSrv.AdminURL()
		}
	})
	if pgErr != nil {
		t.Fatalf("testenv: start shared postgres: %v", pgErr)
	}
	return pgURL
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Database creates a fresh, empty database named t_<random> on the shared
// private Postgres server (or on TEST_DATABASE_URL's server) and returns a
// superuser URL for it. The database is dropped WITH (FORCE) at t.Cleanup,
// terminating remaining connections. It fails the test if the server cannot
// be started or the database cannot be created.
func Database(t testing.TB) string {
	t.Helper()
	base := serverURL(t)
	name := "t_" + randHex(8)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := adminExec(ctx, base, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("testenv: create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := adminExec(ctx, base, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("testenv: drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("testenv: parse database URL: %v", err)
	}
	u.Path = "/" + name
	u.RawPath = ""
	return u.String()
}

func adminExec(ctx context.Context, dsn, sql string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, sql)
	return err
}

// Pool returns a *pgxpool.Pool (default pool settings) connected to a fresh
// Database(t). The pool is closed at t.Cleanup, before the database is
// dropped.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	dsn := Database(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatalf("testenv: pgxpool: %v", err)
	}
	if err := p.Ping(ctx); err != nil {
		p.Close()
		t.Fatalf("testenv: pgxpool ping: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// RedisURL returns the URL ("redis://127.0.0.1:PORT/0") of the shared
// private Redis server, starting it on first use, or TEST_REDIS_URL if set.
// The server is shared by all tests of the binary: isolate keys with
// Prefix(t), and do not FLUSHALL. It fails the test if the server cannot be
// started.
func RedisURL(t testing.TB) string {
	t.Helper()
	if u := os.Getenv(EnvRedisURL); u != "" {
		return u
	}
	requireMain(t, "RedisURL")
	redisOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		defer cancel()
		redisSrv, redisErr = redisproc.Start(ctx, &redisproc.Options{Logger: logger})
		if redisErr == nil {
			redisURL = redisSrv.URL()
		}
	})
	if redisErr != nil {
		t.Fatalf("testenv: start shared redis: %v", redisErr)
	}
	return redisURL
}

// Prefix returns a key prefix unique to this call within the test binary and,
// with high probability, across binaries sharing a server, e.g.
// "t12-9f3a2c1b:". Each call returns a new prefix.
func Prefix(t testing.TB) string {
	t.Helper()
	return fmt.Sprintf("t%d-%s:", counter.Add(1), randHex(4))
}

// Redis returns a *redis.Client on RedisURL(t) (default client settings),
// closed at t.Cleanup.
func Redis(t testing.TB) *redis.Client {
	t.Helper()
	o, err := redis.ParseURL(RedisURL(t))
	if err != nil {
		t.Fatalf("testenv: parse redis URL: %v", err)
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	return c
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

// WaitFor calls cond immediately and then every 5ms until it returns true,
// or fails the test with t.Fatalf(msg) once timeout has elapsed. Use it
// instead of sleeps. cond runs on the calling goroutine.
func WaitFor(t testing.TB, timeout time.Duration, msg string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("testenv.WaitFor: timed out after %v: %s", timeout, msg)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
