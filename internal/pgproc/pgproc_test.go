package pgproc

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/internal/spawn/spawntest"
)

func connect(t *testing.T, ctx context.Context, url string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// start starts a server with opts, closed at the end of the test.
func start(t *testing.T, opts *Options) *Server { return spawntest.Start(t, Start, opts) }

func TestLifecycle(t *testing.T) {
	t.Parallel()
	ctx := t.Context() // Start bounds itself (StartTimeout)
	s := start(t, nil)
	if s.Port() == 5432 || s.Port() == 0 {
		t.Fatalf("bad port %d", s.Port())
	}
	if _, err := os.Stat(filepath.Join(s.Dir(), "data", "PG_VERSION")); err != nil {
		t.Fatal(err)
	}

	c := connect(t, ctx, s.AdminURL())
	var db string
	if err := c.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil || db != "outboxchat" {
		t.Fatalf("db=%q err=%v", db, err)
	}
	if _, err := c.Exec(ctx, "CREATE TABLE t (v text); INSERT INTO t VALUES ('before-kill')"); err != nil {
		t.Fatal(err)
	}
	c.Close(ctx)

	// Crash: committed data must survive crash recovery.
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if s.Running() {
		t.Fatal("running after Kill")
	}
	if _, err := pgx.Connect(ctx, s.AdminURL()); err == nil {
		t.Fatal("connect succeeded after Kill")
	}
	if err := s.Kill(); err != nil { // no-op
		t.Fatal(err)
	}
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	c = connect(t, ctx, s.AdminURL())
	if _, err := c.Exec(ctx, "INSERT INTO t VALUES ('before-stop')"); err != nil {
		t.Fatal(err)
	}
	c.Close(ctx)

	// Clean stop and restart on the same port.
	port := s.Port()
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(ctx); err != nil { // no-op
		t.Fatal(err)
	}
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if s.Port() != port {
		t.Fatalf("port changed %d -> %d", port, s.Port())
	}
	// Immediate shutdown (SIGQUIT, no checkpoint): crash recovery at the
	// next start keeps every committed row.
	if err := s.StopImmediate(ctx); err != nil {
		t.Fatal(err)
	}
	if s.Running() {
		t.Fatal("running after StopImmediate")
	}
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	c = connect(t, ctx, s.AdminURL())
	var n int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil || n != 2 {
		t.Fatalf("rows=%d err=%v", n, err)
	}
	c.Close(ctx)

	spawntest.CheckClose(t, s)
}

func TestCallerDirKeptAndReused(t *testing.T) {
	t.Parallel()
	ctx := t.Context() // Start bounds itself (StartTimeout)
	// The postgres user must be able to traverse every parent, so do not
	// use t.TempDir (its parent is 0700).
	base, err := os.MkdirTemp("", "pgproc-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "pg")
	s := start(t, &Options{Dir: dir})
	c := connect(t, ctx, s.AdminURL())
	if _, err := c.Exec(ctx, "CREATE TABLE keep (v int); INSERT INTO keep VALUES (7)"); err != nil {
		t.Fatal(err)
	}
	c.Close(ctx)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "data", "PG_VERSION")); err != nil {
		t.Fatalf("caller dir removed: %v", err)
	}
	s2 := start(t, &Options{Dir: dir, Port: s.Port()})
	c = connect(t, ctx, s2.AdminURL())
	var v int
	if err := c.QueryRow(ctx, "SELECT v FROM keep").Scan(&v); err != nil || v != 7 {
		t.Fatalf("v=%d err=%v", v, err)
	}
	if s2.URL("x") != "postgres://postgres@127.0.0.1:"+itoa(s2.Port())+"/x?sslmode=disable" {
		t.Fatal(s2.URL("x"))
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func TestPortInUse(t *testing.T) {
	t.Parallel()
	ctx := t.Context() // Start bounds itself (StartTimeout)
	s := start(t, nil)
	_, err := Start(ctx, &Options{Port: s.Port()})
	if err == nil {
		t.Fatal("second server on same port started")
	}
	t.Logf("expected error: %v", err)
}

// TestStandbyCutAndPromote: a standby follows its primary until the
// replication is cut; what the primary commits after that is missing
// from the promoted standby, which then takes writes on a new timeline.
func TestStandbyCutAndPromote(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	primary, err := Start(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer primary.Close()
	exec := func(s *Server, q string) {
		t.Helper()
		conn, err := pgx.Connect(ctx, s.AdminURL())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	exec(primary, "CREATE TABLE t (v int)")
	exec(primary, "INSERT INTO t VALUES (1)")
	standby, err := Start(ctx, &Options{StandbyOf: primary})
	if err != nil {
		t.Fatal(err)
	}
	defer standby.Close()
	exec(primary, "INSERT INTO t VALUES (2)")
	if err := standby.WaitCaughtUp(ctx, primary, 0); err != nil {
		t.Fatal(err)
	}
	if err := standby.CutReplication(ctx); err != nil {
		t.Fatal(err)
	}
	exec(primary, "INSERT INTO t VALUES (3)")
	if err := primary.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	exec(standby, "INSERT INTO t VALUES (4)")
	var got string
	var timeline int
	if err := queryRow(ctx, standby.AdminURL(), "SELECT string_agg(v::text, ',' ORDER BY v), ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int FROM t", nil, &got, &timeline); err != nil {
		t.Fatal(err)
	}
	if got != "1,2,4" || timeline != 2 {
		t.Fatalf("promoted standby holds %q on timeline %d, want 1,2,4 on timeline 2 (3 was committed after the cut)", got, timeline)
	}
}
