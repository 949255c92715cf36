package outbox_test

// Temporary stand-in for internal/testenv (not written yet): one private
// Postgres per test binary, a fresh database per test.

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/internal/pgproc"
)

var (
	envServer *pgproc.Server
	envDBSeq  atomic.Int64
	envOnce   sync.Once
	envErr    error
)

func testMain(m *testing.M) {
	code := m.Run()
	if envServer != nil {
		_ = envServer.Close()
	}
	os.Exit(code)
}

func testPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	envOnce.Do(func() { envServer, envErr = pgproc.Start(context.Background(), nil) })
	if envErr != nil {
		t.Fatalf("start postgres: %v", envErr)
	}
	ctx := context.Background()
	name := fmt.Sprintf("t%d", envDBSeq.Add(1))
	admin, err := pgxpool.New(ctx, envServer.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	p, err := pgxpool.New(ctx, envServer.URL(name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func waitFor(t testing.TB, timeout time.Duration, msg string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, msg)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
