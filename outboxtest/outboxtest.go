// Package outboxtest gives the tests of a service built on outbox, redisq
// and inbox a private PostgreSQL and a private Redis, the way this module's
// own tests get theirs: real servers, started on free ports on 127.0.0.1 in
// temp dirs, never the machine's servers on 5432/6379, removed when the test
// binary ends.
//
// Call Main from TestMain, then ask for what each test needs:
//
//	func TestMain(m *testing.M) { outboxtest.Main(m) }
//
//	func TestSend(t *testing.T) {
//		t.Parallel()
//		pool := outboxtest.Pool(t, "CREATE SCHEMA app;", outbox.TableDDL("app.outbox"))
//		rdb := outboxtest.Redis(t)
//		prefix := outboxtest.Prefix(t) // redisq.PublisherConfig.Prefix / ConsumerConfig.Prefix
//		...
//	}
//
// The servers are shared by all tests of one test binary and started on
// first use (Postgres takes a second or more, as it runs initdb; Redis well
// under a second). Each DatabaseURL or Pool call creates a fresh database, applies the
// given schema and drops the database at t.Cleanup, so tests that run in
// parallel never see each other's rows. Redis is one server: isolate keys
// with Prefix, and never FLUSHALL.
//
// Set TEST_DATABASE_URL (a postgres:// URL of a superuser, on any database)
// or TEST_REDIS_URL (a redis:// URL) to use servers of your own instead; then
// nothing is started.
//
// Requirements: the PostgreSQL server binaries (initdb, postgres: on PATH or
// in /usr/lib/postgresql/*/bin; Debian/Ubuntu package postgresql) and
// redis-server (package redis-server). Available says what is missing. When
// the test process runs as root, Postgres runs as the postgres (or nobody)
// user, because Postgres refuses to run as root.
//
// Servers started here get SIGKILL from the kernel if the test process dies
// (even by SIGKILL), so a crashed or interrupted test run leaves no server
// behind; their temp dirs are removed by the next run. To do this every
// server is started from one goroutine that lives as long as the process: a
// goleak check must ignore it (see SpawnerGoroutine).
//
// Every function is safe for concurrent use, including from parallel tests;
// those taking a testing.TB must be called from the test's own goroutine,
// like t.Fatal.
package outboxtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
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

	"github.com/outboxchat/outboxchat/internal/pgproc"
	"github.com/outboxchat/outboxchat/internal/redisproc"
)

// Environment variables that point tests at existing servers.
const (
	// EnvDatabaseURL names a postgres:// URL of a superuser; DatabaseURL
	// and Pool create their databases on that server instead of a private
	// one.
	EnvDatabaseURL = "TEST_DATABASE_URL"
	// EnvRedisURL names a redis:// URL used instead of a private Redis.
	EnvRedisURL = "TEST_REDIS_URL"
)

// SpawnerGoroutine is the function of the one goroutine that starts every
// server and stays alive for the life of the process (it holds the OS
// thread whose death would kill the servers). Pass it to
// goleak.IgnoreAnyFunction when a TestMain checks for leaked goroutines.
const SpawnerGoroutine = "github.com/outboxchat/outboxchat/internal/spawn.spawnLoop"

// startTimeout bounds the start of one server.
const startTimeout = 60 * time.Second

var (
	mainCalled atomic.Bool
	counter    atomic.Uint64

	pgOnce sync.Once
	pgSrv  *pgproc.Server
	pgURL  string // server-level superuser URL on which databases are created
	pgErr  error

	redisOnce sync.Once
	redisSrv  *redisproc.Server
	redisURL  string
	redisErr  error

	logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
)

// Main runs the tests with Run and exits the process with its code. Call it
// from TestMain.
func Main(m *testing.M) { os.Exit(Run(m)) }

// Run runs the tests (m.Run), then stops the shared servers and removes
// their directories. It returns m.Run's code, or 1 if the tests passed but a
// server failed to stop. Use it instead of Main when TestMain does more
// after the tests (a goleak check, say), then os.Exit with its result.
// Without Main or Run the shared servers would outlive the tests, so
// DatabaseURL, Pool, RedisURL and Redis fail the test instead of starting
// them (unless TEST_DATABASE_URL / TEST_REDIS_URL are set).
func Run(m *testing.M) int {
	mainCalled.Store(true)
	code := m.Run()
	if err := shutdown(); err != nil {
		fmt.Fprintf(os.Stderr, "outboxtest: stopping the shared servers: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

func shutdown() error {
	var errs []error
	if pgSrv != nil {
		errs = append(errs, pgSrv.Close())
	}
	if redisSrv != nil {
		errs = append(errs, redisSrv.Close())
	}
	errs = append(errs, pgproc.RemoveTemplate())
	return errors.Join(errs...)
}

// Available reports why private servers cannot be started on this machine
// (which binary is missing, and how to install it), or nil when they can.
// It starts nothing: use it to skip, with that reason, what needs the
// servers where they may be absent.
func Available() error {
	var errs []error
	if err := pgproc.Available(); err != nil {
		errs = append(errs, fmt.Errorf("%w (install PostgreSQL 15+: apt-get install postgresql)", err))
	}
	if err := redisproc.Available(); err != nil {
		errs = append(errs, fmt.Errorf("%w (install Redis 7+: apt-get install redis-server)", err))
	}
	return errors.Join(errs...)
}

func requireMain(t testing.TB, what string) {
	t.Helper()
	if !mainCalled.Load() {
		t.Fatalf("outboxtest: %s needs the shared servers: add func TestMain(m *testing.M) { outboxtest.Main(m) } (or set %s / %s)",
			what, EnvDatabaseURL, EnvRedisURL)
	}
}

// ServerURL returns a superuser URL of the shared Postgres server (on its
// database "outboxchat"), starting the server on first use, or
// TEST_DATABASE_URL when set. Tests should work in a database of their own
// (DatabaseURL); this is for what needs the server itself (CREATE ROLE,
// say). It fails the test if the server cannot be started.
func ServerURL(t testing.TB) string {
	t.Helper()
	if u := os.Getenv(EnvDatabaseURL); u != "" {
		if !strings.HasPrefix(u, "postgres://") && !strings.HasPrefix(u, "postgresql://") {
			t.Fatalf("outboxtest: %s must be a postgres:// URL", EnvDatabaseURL)
		}
		return u
	}
	requireMain(t, "a database")
	pgOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		defer cancel()
		pgSrv, pgErr = pgproc.Start(ctx, &pgproc.Options{Logger: logger})
		if pgErr == nil {
			pgURL = pgSrv.AdminURL()
		}
	})
	if pgErr != nil {
		t.Fatalf("outboxtest: start the shared postgres: %v", pgErr)
	}
	return pgURL
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// DatabaseURL creates a fresh database named t_<16 hex digits> on the shared
// Postgres server (or on TEST_DATABASE_URL's server), executes each schema
// string in it in order (each may hold several statements separated by ';',
// e.g. "CREATE SCHEMA app;" then outbox.TableDDL("app.outbox")), and returns
// a superuser URL for it. The database is dropped WITH (FORCE) at
// t.Cleanup, ending any connection still open. It fails the test if the
// server cannot be started, the database cannot be created or a schema
// string fails (the error names which one, counting from 0).
func DatabaseURL(t testing.TB, schema ...string) string {
	t.Helper()
	base := ServerURL(t)
	name := "t_" + randHex(8)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := execSQL(ctx, base, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("outboxtest: create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := execSQL(ctx, base, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("outboxtest: drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("outboxtest: parse database URL: %v", err)
	}
	u.Path = "/" + name
	u.RawPath = ""
	dsn := u.String()
	if err := execSQL(ctx, dsn, schema...); err != nil {
		t.Fatalf("outboxtest: apply schema: %v", err)
	}
	return dsn
}

// execSQL runs each sql string on one connection to dsn (simple protocol, so a
// string may hold several statements).
func execSQL(ctx context.Context, dsn string, sql ...string) error {
	if len(sql) == 0 {
		return nil
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for i, s := range sql {
		if _, err := conn.Exec(ctx, s, pgx.QueryExecModeSimpleProtocol); err != nil {
			if len(sql) == 1 {
				return err
			}
			return fmt.Errorf("schema[%d]: %w", i, err)
		}
	}
	return nil
}

// Pool returns a *pgxpool.Pool (pgxpool's default settings) on a fresh
// DatabaseURL(t, schema...). The pool is closed at t.Cleanup, before the
// database is dropped.
func Pool(t testing.TB, schema ...string) *pgxpool.Pool {
	t.Helper()
	dsn := DatabaseURL(t, schema...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatalf("outboxtest: pgxpool: %v", err)
	}
	if err := p.Ping(ctx); err != nil {
		p.Close()
		t.Fatalf("outboxtest: pgxpool ping: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// RedisURL returns the URL ("redis://127.0.0.1:PORT/0") of the shared
// Redis server (appendonly yes, appendfsync everysec), starting it on first
// use, or TEST_REDIS_URL when set. All tests of the binary share it: isolate
// keys with Prefix, and never FLUSHALL. It fails the test if the server
// cannot be started.
func RedisURL(t testing.TB) string {
	t.Helper()
	if u := os.Getenv(EnvRedisURL); u != "" {
		return u
	}
	requireMain(t, "Redis")
	redisOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		defer cancel()
		redisSrv, redisErr = redisproc.Start(ctx, &redisproc.Options{Logger: logger})
		if redisErr == nil {
			redisURL = redisSrv.URL()
		}
	})
	if redisErr != nil {
		t.Fatalf("outboxtest: start the shared redis: %v", redisErr)
	}
	return redisURL
}

// Redis returns a *redis.Client (go-redis's default settings) on
// RedisURL(t), closed at t.Cleanup. For the fail-fast settings the queue
// wants, use redisq.NewClient(outboxtest.RedisURL(t)) instead.
func Redis(t testing.TB) *redis.Client {
	t.Helper()
	o, err := redis.ParseURL(RedisURL(t))
	if err != nil {
		t.Fatalf("outboxtest: parse redis URL: %v", err)
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Prefix returns a key prefix unique to this call within the test binary
// and, with high probability, across binaries sharing a server, e.g.
// "t12-9f3a2c1b:". Each call returns a new prefix. Give it to
// redisq.PublisherConfig.Prefix and redisq.ConsumerConfig.Prefix so that
// parallel tests use different streams.
func Prefix(t testing.TB) string {
	t.Helper()
	return fmt.Sprintf("t%d-%s:", counter.Add(1), randHex(4))
}

// WaitFor calls cond at once and then every 5 ms until it returns true, or
// fails the test with t.Fatalf(msg) once timeout has passed. Use it rather
// than a sleep to wait for something asynchronous (a relayed event reaching
// an inbox, say). cond runs on the calling goroutine.
func WaitFor(t testing.TB, timeout time.Duration, msg string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("outboxtest.WaitFor: timed out after %v: %s", timeout, msg)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Servers is a private PostgreSQL and Redis pair of its own, for what has no
// testing.TB (an Example, a TestMain, a program) or must not share the
// per-binary servers. Start it, use the URLs, Close it. Its methods are safe
// for concurrent use.
type Servers struct {
	// DatabaseURL is a superuser URL of the server's database
	// "outboxchat": "postgres://postgres@127.0.0.1:PORT/outboxchat?sslmode=disable".
	DatabaseURL string
	// RedisURL is "redis://127.0.0.1:PORT/0" (appendonly yes).
	RedisURL string

	pg *pgproc.Server
	rd *redisproc.Server
}

// Start starts a private Postgres (fsync off: data survives a crash of the
// server but not of the machine) and a private Redis, each on a free port on
// 127.0.0.1 in a temp dir, and waits until both accept connections. ctx
// bounds the start (each server also gives up after 60 s). On error nothing
// is left running; the error says what failed (see also Available). Servers
// started in a test binary are better stopped before it ends (Close): the
// next run removes the temp dirs of a process that did not.
func Start(ctx context.Context) (*Servers, error) {
	s := &Servers{}
	var wg sync.WaitGroup
	var pgErr, rdErr error
	wg.Add(2)
	go func() {
		defer wg.Done()
		s.pg, pgErr = pgproc.Start(ctx, &pgproc.Options{Logger: logger, StartTimeout: startTimeout})
	}()
	go func() {
		defer wg.Done()
		s.rd, rdErr = redisproc.Start(ctx, &redisproc.Options{Logger: logger, StartTimeout: startTimeout})
	}()
	wg.Wait()
	if err := errors.Join(pgErr, rdErr); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("outboxtest: start servers: %w", err)
	}
	s.DatabaseURL, s.RedisURL = s.pg.AdminURL(), s.rd.URL()
	return s, nil
}

// Close stops both servers and removes their directories. It is idempotent
// and returns the first error of each server joined.
func (s *Servers) Close() error {
	var errs []error
	if s.rd != nil {
		errs = append(errs, s.rd.Close())
	}
	if s.pg != nil {
		errs = append(errs, s.pg.Close())
	}
	return errors.Join(errs...)
}
