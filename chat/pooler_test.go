package chat

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/internal/pgbouncerproc"
	"github.com/outboxchat/outboxchat/internal/testenv"
)

// selfChecks records the LISTEN self-check outcomes of one process.
type selfChecks struct {
	mu  sync.Mutex
	got []bool
}

func (s *selfChecks) on(ok bool) { s.mu.Lock(); s.got = append(s.got, ok); s.mu.Unlock() }

func (s *selfChecks) first(t testing.TB) bool {
	t.Helper()
	var ok bool
	testenv.WaitFor(t, 30*time.Second, "the LISTEN self-check's outcome", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.got) > 0 {
			ok = s.got[0]
			return true
		}
		return false
	})
	return ok
}

// pooled returns the service role's URL through the shared private
// PgBouncer (transaction mode) with the query mode a transaction pooler
// needs.
func (h *harness) pooled(service string) string {
	return testenv.PgBouncer(h.t).Rewrite(h.roleURL(service)) + "&default_query_exec_mode=exec"
}

// Both services through a real PgBouncer in transaction mode, with the
// direct LISTEN URL: sends, the relay, the inbox, the gateway and receipts
// all work, each message once, and the self-check passes. A third API
// process without --listen-database-url warns (log, metric 0) and keeps
// delivering at its poll.
func TestServeThroughPgBouncer(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	var consChecks, workChecks, loneChecks selfChecks
	var loneLog testenv.SyncBuffer
	viaPooler := func(service string, checks *selfChecks) func(*Config) {
		return func(c *Config) {
			c.DatabaseURL, c.ListenDatabaseURL = h.pooled(service), h.roleURL(service)
			c.onSelfCheck = checks.on
		}
	}
	cons := h.start(Consumers, viaPooler(Consumers, &consChecks))
	work := h.start(Workers, viaPooler(Workers, &workChecks))
	lone := h.start(Consumers, func(c *Config) {
		c.Roles = []string{RoleAPI}
		c.DatabaseURL = h.pooled(Consumers)
		c.onSelfCheck = loneChecks.on
		c.Logger = slog.New(slog.NewTextHandler(&loneLog, nil))
	})
	if !consChecks.first(t) || !workChecks.first(t) {
		t.Error("the self-check failed with a direct LISTEN URL")
	}
	if loneChecks.first(t) {
		t.Error("the self-check passed with LISTEN through a transaction-mode pooler")
	}
	if !strings.Contains(loneLog.String(), "LISTEN SELF-CHECK FAILED") || !strings.Contains(loneLog.String(), "--listen-database-url") {
		t.Errorf("no warning naming the fix; log:\n%s", loneLog.String())
	}
	for _, c := range []struct {
		base string
		want string
	}{{cons.base, "outboxchat_listen_selfcheck_ok 1\n"}, {work.base, "outboxchat_listen_selfcheck_ok 1\n"}, {lone.base, "outboxchat_listen_selfcheck_ok 0\n"}} {
		if _, m := getStatus(t, c.base+"/metrics"); !strings.Contains(m, c.want) {
			t.Errorf("%s/metrics lacks %q", c.base, c.want)
		}
	}

	const chat, n = 21, 5
	wc, cc, lc := watch(t, work.base, chat), watch(t, cons.base, chat), watch(t, lone.base, chat)
	for i := 1; i <= n; i++ {
		send(t, cons.base, chat, fmt.Sprint("c", i))
		send(t, work.base, chat, fmt.Sprint("w", i))
	}
	wc.waitSeqs(t, Consumers, n, 30*time.Second)
	cc.waitSeqs(t, Workers, n, 30*time.Second)
	testenv.WaitFor(t, 30*time.Second, "receipts for every message", func() bool {
		return cc.lastReceipt(Consumers).UptoSeq == n && wc.lastReceipt(Workers).UptoSeq == n
	})
	// The process whose LISTEN does not work still gets everything, by its
	// poll.
	lc.waitSeqs(t, Workers, n, 30*time.Second)
	lc.waitSeqs(t, Consumers, n, 30*time.Second)
	for _, table := range []string{"consumers.messages", "consumers.inbox", "workers.messages", "workers.inbox"} {
		if got := h.count(t, `SELECT count(*) FROM `+table+` WHERE chat_id = $1`, chat); got != n {
			t.Errorf("%s holds %d rows of chat %d, want %d", table, got, chat, n)
		}
	}
}

// Without default_query_exec_mode behind a transaction-mode pooler, serve
// refuses to start with ErrTransactionPooler (it used to fail later, on
// most sends, with "prepared statement … does not exist"); it no longer
// sends a startup parameter PgBouncer rejects. Migrations work through the
// pooler with the option set.
func TestServeRefusesTransactionPoolerWithoutExecMode(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := Serve(ctx, Config{
		Service: Consumers, Roles: []string{RoleAPI}, HTTPAddr: "127.0.0.1:0",
		DatabaseURL: testenv.PgBouncer(t).Rewrite(h.roleURL(Consumers)),
		Auth:        AuthConfig{SecretFile: h.secretFile}, Logger: slog.New(slog.DiscardHandler),
	})
	if !errors.Is(err, ErrTransactionPooler) {
		t.Fatalf("Serve through a transaction pooler without exec mode: %v, want ErrTransactionPooler", err)
	}
	if !strings.Contains(err.Error(), "default_query_exec_mode=exec") {
		t.Errorf("the error does not name the URL option: %v", err)
	}

	// Bootstrap and migrations of a fresh database, through the pooler.
	fresh := testenv.PgBouncer(t).Rewrite(testenv.Database(t)) + "&default_query_exec_mode=exec"
	admin, err := pgxpool.New(ctx, fresh)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	for _, s := range []string{Consumers, Workers} {
		if err := Bootstrap(ctx, admin, s); err != nil {
			t.Fatalf("bootstrap %s through the pooler: %v", s, err)
		}
		if n, err := Migrate(ctx, admin, s); err != nil || n == 0 {
			t.Fatalf("migrate %s through the pooler: %d applied, %v", s, n, err)
		}
	}
}

// Two API processes of one service, both through the pooler with the
// direct LISTEN URL and a gateway poll of an hour: a client of one gets
// the messages sent through the other, which only a NOTIFY can bring.
func TestOtherAPIProcessSendsArriveByNotifyThroughPgBouncer(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	api := func(c *Config) {
		c.Roles = []string{RoleAPI}
		c.DatabaseURL, c.ListenDatabaseURL = h.pooled(Consumers), h.roleURL(Consumers)
		c.gatewayPoll = time.Hour
	}
	a := h.start(Consumers, api)
	b := h.start(Consumers, api)
	w := watch(t, a.base, 22)
	for i := 1; i <= 3; i++ {
		send(t, b.base, 22, fmt.Sprint("via b ", i))
		w.waitSeqs(t, Consumers, i, 30*time.Second)
	}
}

// A managed service's admin user is no superuser, only CREATEROLE (and the
// database's owner): migrate with it creates the roles, schemas and tables,
// owned by the service roles (PostgreSQL 15 refused CREATE SCHEMA …
// AUTHORIZATION until the admin was a member of the role).
func TestBootstrapAsCreateRoleAdmin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	su := testenv.Database(t)
	sup, err := pgxpool.New(ctx, su)
	if err != nil {
		t.Fatal(err)
	}
	defer sup.Close()
	u, err := url.Parse(su)
	if err != nil {
		t.Fatal(err)
	}
	admin := "adm_" + strings.TrimPrefix(u.Path, "/")
	for _, q := range []string{
		"CREATE ROLE " + admin + " LOGIN CREATEROLE",
		"ALTER DATABASE " + strings.TrimPrefix(u.Path, "/") + " OWNER TO " + admin,
	} {
		if _, err := sup.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	u.User = url.User(admin)
	ap, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer ap.Close()
	for _, s := range []string{Consumers, Workers} {
		if err := Bootstrap(ctx, ap, s); err != nil {
			t.Fatalf("bootstrap %s as a CREATEROLE admin: %v", s, err)
		}
		if _, err := Migrate(ctx, ap, s); err != nil {
			t.Fatalf("migrate %s as a CREATEROLE admin: %v", s, err)
		}
		var owner string
		if err := sup.QueryRow(ctx, `SELECT tableowner FROM pg_tables WHERE schemaname = $1 AND tablename = 'outbox'`, s).Scan(&owner); err != nil || owner != s {
			t.Errorf("%s.outbox owned by %q (%v), want %s", s, owner, err, s)
		}
	}
}

// Through PgBouncer in session mode nothing is needed: the URL keeps pgx's
// default query mode (the start-up probe passes), LISTEN works through it
// (the self-check passes), sends are stored and shown.
func TestServeThroughSessionModePgBouncer(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	u, err := url.Parse(h.adminURL)
	if err != nil {
		t.Fatal(err)
	}
	session, err := pgbouncerproc.Start(context.Background(), &pgbouncerproc.Options{
		Upstream: u.Host, Mode: pgbouncerproc.ModeSession, Users: []string{Consumers},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = session.Close() })
	var checks selfChecks
	api := h.start(Consumers, func(c *Config) {
		c.Roles = []string{RoleAPI}
		c.DatabaseURL = session.Rewrite(h.roleURL(Consumers))
		c.onSelfCheck = checks.on
	})
	if !checks.first(t) {
		t.Error("the self-check failed through a session-mode pooler")
	}
	w := watch(t, api.base, 23)
	send(t, api.base, 23, "through a session pooler")
	w.waitSeqs(t, Consumers, 1, 30*time.Second)
}
