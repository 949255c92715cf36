package testenv

import (
	"context"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/outboxtest"
)

func TestMain(m *testing.M) { Main(m) }

func TestDatabaseIsolatedAndDropped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var name string
	t.Run("create", func(t *testing.T) {
		a, b := Database(t), Database(t)
		if a == b {
			t.Fatal("same database twice")
		}
		u, _ := url.Parse(a)
		name = strings.TrimPrefix(u.Path, "/")
		if !strings.HasPrefix(name, "t_") || u.Port() == "5432" {
			t.Fatalf("bad URL %s", a)
		}
		ca, err := pgx.Connect(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		defer ca.Close(ctx)
		if _, err := ca.Exec(ctx, "CREATE TABLE only_in_a (id int)"); err != nil {
			t.Fatal(err)
		}
		cb, err := pgx.Connect(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		defer cb.Close(ctx)
		var n int
		if err := cb.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename = 'only_in_a'").Scan(&n); err != nil || n != 0 {
			t.Fatalf("n=%d err=%v", n, err)
		}
		// An open connection must not prevent the drop (WITH (FORCE)).
	})
	c, err := pgx.Connect(ctx, outboxtest.ServerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var exists bool
	if err := c.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil || exists {
		t.Fatalf("database %s not dropped (exists=%v err=%v)", name, exists, err)
	}
}

func TestPool(t *testing.T) {
	t.Parallel()
	p := Pool(t)
	var one int
	if err := p.QueryRow(context.Background(), "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatal(one, err)
	}
}

func TestRedisPrefix(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if strings.Contains(RedisURL(t), ":6379") {
		t.Fatal("system redis used")
	}
	p1, p2 := Prefix(t), Prefix(t)
	if p1 == p2 || !strings.HasPrefix(p1, "t") || !strings.HasSuffix(p1, ":") {
		t.Fatal(p1, p2)
	}
	c := Redis(t)
	if err := c.Set(ctx, p1+"k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Exists(ctx, p2+"k").Result(); err != nil || n != 0 {
		t.Fatal(n, err)
	}
}

func TestPrivateServers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := PrivatePostgres(t)
	rs := PrivateRedis(t)
	if err := pg.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := rs.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := pg.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rs.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := pgx.Connect(ctx, pg.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	c.Close(ctx)
}

func TestWaitFor(t *testing.T) {
	t.Parallel()
	var n atomic.Int32
	go func() {
		for range 3 {
			n.Add(1)
		}
	}()
	WaitFor(t, 5*time.Second, "counter reaches 3", func() bool { return n.Load() == 3 })
}
