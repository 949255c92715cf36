package outboxtest_test

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/outbox"
	"github.com/outboxchat/outboxchat/outboxtest"
)

// TestMain skips Example, which starts servers of its own, with the reason
// when the server binaries are missing (an example cannot skip itself);
// the tests below then fail with the same reason.
func TestMain(m *testing.M) {
	flag.Parse()
	if err := outboxtest.Available(); err != nil {
		fmt.Printf("outboxtest: skipping Example: %v\n", err)
		skip := "^Example$"
		if s := flag.Lookup("test.skip").Value.String(); s != "" {
			skip = "(" + s + ")|" + skip
		}
		_ = flag.Set("test.skip", skip)
	}
	outboxtest.Main(m)
}

func TestDatabaseURLAppliesSchemaAndIsolates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var name string
	t.Run("use", func(t *testing.T) {
		a := outboxtest.DatabaseURL(t, "CREATE SCHEMA app;", outbox.TableDDL("app.outbox"))
		b := outboxtest.DatabaseURL(t)
		u, err := url.Parse(a)
		if err != nil {
			t.Fatal(err)
		}
		name = strings.TrimPrefix(u.Path, "/")
		if a == b || !strings.HasPrefix(name, "t_") || u.Hostname() != "127.0.0.1" || u.Port() == "5432" && os.Getenv(outboxtest.EnvDatabaseURL) == "" {
			t.Fatalf("URLs %s and %s", a, b)
		}
		var inA, inB bool
		for dsn, got := range map[string]*bool{a: &inA, b: &inB} {
			c, err := pgx.Connect(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close(ctx) // left open: the drop must end it (WITH (FORCE))
			if err := c.QueryRow(ctx, `SELECT to_regclass('app.outbox') IS NOT NULL`).Scan(got); err != nil {
				t.Fatal(err)
			}
		}
		if !inA || inB {
			t.Fatalf("app.outbox in the database with the schema: %v, in the one without: %v", inA, inB)
		}
	})
	c, err := pgx.Connect(ctx, outboxtest.ServerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var exists bool
	if err := c.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil || exists {
		t.Fatalf("database %s not dropped at cleanup (exists=%v err=%v)", name, exists, err)
	}
}

// fatalTB records Fatalf instead of failing the real test, and ends the
// goroutine like t.Fatal does.
type fatalTB struct {
	testing.TB
	mu  sync.Mutex
	msg string
}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.msg = fmt.Sprintf(format, args...)
	f.mu.Unlock()
	runtime.Goexit()
}

func TestDatabaseURLBadSchemaFailsTheTest(t *testing.T) {
	t.Parallel()
	f := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		outboxtest.DatabaseURL(f, "CREATE SCHEMA ok;", "CREATE TABLE nowhere.x (id int);")
		t.Error("DatabaseURL returned after a failing schema")
	}()
	<-done
	if !strings.Contains(f.msg, "schema[1]") || !strings.Contains(f.msg, "nowhere") {
		t.Fatalf("Fatalf message %q does not name the failing schema string", f.msg)
	}
}

func TestPoolAndRedisPrefix(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := outboxtest.Pool(t, "CREATE TABLE t (id int); INSERT INTO t VALUES (7);")
	var got int
	if err := p.QueryRow(ctx, "SELECT id FROM t").Scan(&got); err != nil || got != 7 {
		t.Fatal(got, err)
	}
	if u := outboxtest.RedisURL(t); strings.Contains(u, ":6379/") && os.Getenv(outboxtest.EnvRedisURL) == "" {
		t.Fatalf("the machine's Redis is used: %s", u)
	}
	p1, p2 := outboxtest.Prefix(t), outboxtest.Prefix(t)
	if p1 == p2 || !strings.HasSuffix(p1, ":") {
		t.Fatal(p1, p2)
	}
	c := outboxtest.Redis(t)
	if err := c.Set(ctx, p1+"k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Exists(ctx, p2+"k").Result(); err != nil || n != 0 {
		t.Fatal(n, err)
	}
}

func TestStartAndClose(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := outboxtest.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c, err := pgx.Connect(ctx, s.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	c.Close(ctx)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if c, err := pgx.Connect(cctx, s.DatabaseURL); err == nil {
		c.Close(ctx)
		t.Fatal("Postgres still answers after Close")
	}
}

func TestWaitFor(t *testing.T) {
	t.Parallel()
	var n atomic.Int32
	go func() {
		for range 3 {
			n.Add(1)
		}
	}()
	outboxtest.WaitFor(t, 5*time.Second, "counter reaches 3", func() bool { return n.Load() == 3 })
}
