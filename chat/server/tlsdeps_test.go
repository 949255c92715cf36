package server

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/internal/devca"
	"github.com/outboxchat/outboxchat/internal/pgproc"
	"github.com/outboxchat/outboxchat/internal/redisproc"
	"github.com/outboxchat/outboxchat/redisq"
)

// Both services reach a private Postgres with sslmode=verify-full and a
// private Redis (TLS only) with rediss://, both certified by a private CA:
// messages go both ways over them, every service connection to Postgres
// is encrypted, and a client that trusts another CA is refused by both.
func TestServeOverTLSToPostgresAndRedis(t *testing.T) {
	t.Parallel()
	ca, err := devca.New()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	caFile, err := ca.WriteCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := ca.Issue(dir, "db", "127.0.0.1", "localhost")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pg, err := pgproc.Start(ctx, &pgproc.Options{TLSCertFile: cert, TLSKeyFile: key})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.Close() })
	rd, err := redisproc.Start(ctx, &redisproc.Options{TLSCertFile: cert, TLSKeyFile: key})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rd.Close() })
	if !strings.HasPrefix(rd.URL(), "rediss://") {
		t.Fatalf("redis URL %s, want rediss://", rd.URL())
	}
	redisURL := rd.URL() + "?" + redisq.TLSCAFileParam + "=" + caFile
	h := newHarnessOn(t, pg.AdminURL(), redisURL)
	verified := func(service, root string) string {
		return strings.Replace(h.RoleURL(service), "sslmode=disable", "sslmode=verify-full&sslrootcert="+root, 1)
	}
	cons := h.start(chat.Consumers, func(c *Config) { c.DatabaseURL = verified(chat.Consumers, caFile) })
	work := h.start(chat.Workers, func(c *Config) { c.DatabaseURL = verified(chat.Workers, caFile) })
	wc, cc := chattest.Watch(t, work.base, 31), chattest.Watch(t, cons.base, 31)
	for i := 1; i <= 3; i++ {
		chattest.Send(t, cons.base, 31, fmt.Sprint("c", i))
		chattest.Send(t, work.base, 31, fmt.Sprint("w", i))
	}
	wc.WaitSeqs(t, chat.Consumers, 3, 30*time.Second)
	cc.WaitSeqs(t, chat.Workers, 3, 30*time.Second)
	if n := h.Count(t, `SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
		WHERE a.usename IN ('consumers', 'workers') AND s.ssl`); n == 0 {
		t.Error("no service connection to Postgres uses TLS")
	}
	if n := h.Count(t, `SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
		WHERE a.usename IN ('consumers', 'workers') AND NOT s.ssl`); n != 0 {
		t.Errorf("%d service connections to Postgres without TLS", n)
	}

	// Another CA's certificate does not verify either server.
	other, err := devca.New()
	if err != nil {
		t.Fatal(err)
	}
	otherDir := t.TempDir()
	otherCA, err := other.WriteCA(otherDir)
	if err != nil {
		t.Fatal(err)
	}
	if c, err := pgx.Connect(ctx, verified(chat.Consumers, otherCA)); err == nil {
		_ = c.Close(ctx)
		t.Error("verify-full accepted a server certificate of another CA")
	}
	rc, err := redisq.NewClient(rd.URL() + "?" + redisq.TLSCAFileParam + "=" + filepath.Join(otherDir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if err := rc.Ping(ctx).Err(); err == nil {
		t.Error("rediss:// accepted a server certificate of another CA")
	}
	// Plain redis:// to the TLS port gets nothing.
	plain, err := redisq.NewClient(strings.Replace(rd.URL(), "rediss://", "redis://", 1))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if err := plain.Ping(ctx).Err(); err == nil {
		t.Error("plain redis:// reached the TLS-only port")
	}
}
