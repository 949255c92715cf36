package server

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

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/auth"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/chat/schema"
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
	return testenv.PgBouncer(h.t).Rewrite(h.RoleURL(service)) + "&default_query_exec_mode=exec"
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
			c.DatabaseURL, c.ListenDatabaseURL = h.pooled(service), h.RoleURL(service)
			c.onSelfCheck = checks.on
		}
	}
	cons := h.start(chat.Consumers, viaPooler(chat.Consumers, &consChecks))
	work := h.start(chat.Workers, viaPooler(chat.Workers, &workChecks))
	lone := h.startAPI(chat.Consumers, func(c *Config) {
		c.DatabaseURL = h.pooled(chat.Consumers)
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

	const chatN, n = 21, 5
	wc, cc, lc := chattest.Watch(t, work.base, chatN), chattest.Watch(t, cons.base, chatN), chattest.Watch(t, lone.base, chatN)
	for i := 1; i <= n; i++ {
		chattest.Send(t, cons.base, chatN, fmt.Sprint("c", i))
		chattest.Send(t, work.base, chatN, fmt.Sprint("w", i))
	}
	wc.WaitSeqs(t, chat.Consumers, n, 30*time.Second)
	cc.WaitSeqs(t, chat.Workers, n, 30*time.Second)
	testenv.WaitFor(t, 30*time.Second, "receipts for every message", func() bool {
		return cc.LastReceipt(chat.Consumers).UptoSeq == n && wc.LastReceipt(chat.Workers).UptoSeq == n
	})
	// The process whose LISTEN does not work still gets everything, by its
	// poll.
	lc.WaitSeqs(t, chat.Workers, n, 30*time.Second)
	lc.WaitSeqs(t, chat.Consumers, n, 30*time.Second)
	for _, table := range []string{"consumers.messages", "consumers.inbox", "workers.messages", "workers.inbox"} {
		if got := h.Count(t, `SELECT count(*) FROM `+table+` WHERE chat_id = $1`, chatN); got != n {
			t.Errorf("%s holds %d rows of chat %d, want %d", table, got, chatN, n)
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
		Service: chat.Consumers, Roles: []string{RoleAPI},
		DatabaseURL: testenv.PgBouncer(t).Rewrite(h.RoleURL(chat.Consumers)),
		API:         APIConfig{HTTPAddr: "127.0.0.1:0", Auth: auth.Config{SecretFile: h.SecretFile}}, Logger: slog.New(slog.DiscardHandler),
	})
	if !errors.Is(err, schema.ErrTransactionPooler) {
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
	for _, s := range []string{chat.Consumers, chat.Workers} {
		if err := schema.Bootstrap(ctx, admin, s); err != nil {
			t.Fatalf("bootstrap %s through the pooler: %v", s, err)
		}
		if n, err := schema.Migrate(ctx, admin, s); err != nil || n == 0 {
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
		c.DatabaseURL, c.ListenDatabaseURL = h.pooled(chat.Consumers), h.RoleURL(chat.Consumers)
		c.gatewayPoll = time.Hour
	}
	a := h.start(chat.Consumers, api)
	b := h.start(chat.Consumers, api)
	sendsArrive(t, a, b, 22, 30*time.Second)
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
	for _, s := range []string{chat.Consumers, chat.Workers} {
		if err := schema.Bootstrap(ctx, ap, s); err != nil {
			t.Fatalf("bootstrap %s as a CREATEROLE admin: %v", s, err)
		}
		if _, err := schema.Migrate(ctx, ap, s); err != nil {
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
	u, err := url.Parse(h.AdminURL)
	if err != nil {
		t.Fatal(err)
	}
	session, err := pgbouncerproc.Start(context.Background(), &pgbouncerproc.Options{
		Upstream: u.Host, Mode: pgbouncerproc.ModeSession, Users: []string{chat.Consumers},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = session.Close() })
	var checks selfChecks
	api := h.startAPI(chat.Consumers, func(c *Config) {
		c.DatabaseURL = session.Rewrite(h.RoleURL(chat.Consumers))
		c.onSelfCheck = checks.on
	})
	if !checks.first(t) {
		t.Error("the self-check failed through a session-mode pooler")
	}
	w := chattest.Watch(t, api.base, 23)
	chattest.Send(t, api.base, 23, "through a session pooler")
	w.WaitSeqs(t, chat.Consumers, 1, 30*time.Second)
}
