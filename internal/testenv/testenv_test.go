package testenv

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// The shared servers, databases, prefixes and WaitFor are outboxtest's and
// tested there; these check that testenv hands them on, and its own
// private servers.

func TestMain(m *testing.M) { Main(m) }

func TestDelegatesToOutboxtest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u, err := url.Parse(Database(t))
	if err != nil || !strings.HasPrefix(u.Path, "/t_") {
		t.Fatalf("Database: %v %v", u, err)
	}
	var one int
	if err := Pool(t).QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatal(one, err)
	}
	if p1, p2 := Prefix(t), Prefix(t); RedisURL(t) == "" || p1 == p2 {
		t.Fatalf("RedisURL or Prefix (%q, %q)", p1, p2)
	}
	if err := Redis(t).Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	n := 0
	WaitFor(t, 5*time.Second, "n reaches 3", func() bool { n++; return n == 3 })
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
