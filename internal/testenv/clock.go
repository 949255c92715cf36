package testenv

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/internal/pgproc"
)

// SteppedPostgres is a private PostgreSQL server whose wall clock the test
// can step, with libfaketime preloaded into the server: every backend's
// now(), clock_timestamp() and the like read the real time plus an offset
// the test sets with Step, while its monotonic clock (latch waits, timeouts)
// is left alone. The test process's own clock is not touched.
type SteppedPostgres struct {
	*pgproc.Server
	file string // FAKETIME_TIMESTAMP_FILE: the offset, read on every call
}

// PrivateSteppedPostgres starts a SteppedPostgres for this test alone, with
// its clock at the real time (offset 0). It is closed at t.Cleanup. It fails
// the test when libfaketime is not installed (scripts/install-deps.sh --test
// installs it: Debian's libfaketime) or when the server's clock does not
// follow a step, so a test on it never passes without a stepped clock.
func PrivateSteppedPostgres(t testing.TB) *SteppedPostgres {
	t.Helper()
	libs, _ := filepath.Glob("/usr/lib/*/faketime/libfaketime.so.1")
	if len(libs) == 0 {
		t.Fatal("testenv: libfaketime not found: run scripts/install-deps.sh --test (or make deps) to install it")
	}
	// Not t.TempDir: its parent is private to this user, and the server may
	// run as another (pgproc, as root) that must read the file.
	dir, err := os.MkdirTemp("", "faketime-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := &SteppedPostgres{file: filepath.Join(dir, "faketime")}
	p.write(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	s, err := pgproc.Start(ctx, &pgproc.Options{Logger: logger, Env: []string{
		"LD_PRELOAD=" + libs[0],
		"FAKETIME_TIMESTAMP_FILE=" + p.file,
		"FAKETIME_NO_CACHE=1",            // a Step applies to the next call
		"FAKETIME_DONT_FAKE_MONOTONIC=1", // latch waits and timeouts keep real time
	}})
	if err != nil {
		t.Fatalf("testenv: start private postgres with libfaketime: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("testenv: close private postgres: %v", err)
		}
	})
	p.Server = s
	return p
}

// Step sets the server's clock to the real time plus offset (negative: in
// the past) for every call from now on, and checks with a query that the
// server's now() moved there (within 2 minutes), failing the test if not.
func (p *SteppedPostgres) Step(t testing.TB, offset time.Duration) {
	t.Helper()
	p.write(t, offset)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.AdminURL())
	if err != nil {
		t.Fatalf("testenv: connect to the stepped postgres: %v", err)
	}
	defer conn.Close(ctx)
	var now time.Time
	if err := conn.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
		t.Fatalf("testenv: read the stepped postgres's clock: %v", err)
	}
	if d := now.Sub(time.Now().Add(offset)); d > 2*time.Minute || d < -2*time.Minute {
		t.Fatalf("testenv: the postgres clock reads %v, %v off the %v step: libfaketime did not take", now, d, offset)
	}
}

// write puts offset in libfaketime's format ("+3600" or "-3600": seconds
// from the real time) into the file the server reads on every clock call.
func (p *SteppedPostgres) write(t testing.TB, offset time.Duration) {
	t.Helper()
	s := strconv.FormatInt(int64(offset/time.Second), 10)
	if offset >= 0 {
		s = "+" + s
	}
	// Written whole to a new name and renamed: a backend never reads half.
	tmp := p.file + ".new"
	if err := os.WriteFile(tmp, []byte(s+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, p.file); err != nil {
		t.Fatal(err)
	}
}
