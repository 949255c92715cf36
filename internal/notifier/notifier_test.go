package notifier_test

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/internal/notifier"
	"github.com/outboxchat/outboxchat/internal/pgbouncerproc"
	"github.com/outboxchat/outboxchat/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const wait = 20 * time.Second

// events records one subscription's callbacks.
type events struct {
	mu       sync.Mutex
	payloads []string
	ups      int
	downs    []error
}

func (e *events) sub(channel string, skipOwn bool) notifier.Subscription {
	return notifier.Subscription{
		Channel: channel,
		SkipOwn: skipOwn,
		Notify: func(p string, _ uint32) {
			e.mu.Lock()
			e.payloads = append(e.payloads, p)
			e.mu.Unlock()
		},
		Up: func() {
			e.mu.Lock()
			e.ups++
			e.mu.Unlock()
		},
		Down: func(err error) {
			e.mu.Lock()
			e.downs = append(e.downs, err)
			e.mu.Unlock()
		},
	}
}

func (e *events) has(p string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, x := range e.payloads {
		if x == p {
			return true
		}
	}
	return false
}

func (e *events) snapshot() (payloads []string, ups int, downs []error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.payloads...), e.ups, append([]error(nil), e.downs...)
}

// ownPool is a pool whose connections' backend PIDs are recorded, as
// chat.Serve records its process's own.
func ownPool(t *testing.T, base *pgxpool.Pool) (*pgxpool.Pool, func(uint32) bool) {
	t.Helper()
	var own sync.Map
	cfg := base.Config()
	cfg.AfterConnect = func(_ context.Context, c *pgx.Conn) error {
		own.Store(c.PgConn().PID(), true)
		return nil
	}
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p, func(pid uint32) bool { _, ok := own.Load(pid); return ok }
}

func start(t *testing.T, n *notifier.Notifier) {
	t.Helper()
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Stop(context.Background()); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
}

func notify(t *testing.T, p *pgxpool.Pool, channel, payload string) {
	t.Helper()
	if _, err := p.Exec(context.Background(), "SELECT pg_notify($1, $2)", channel, payload); err != nil {
		t.Fatal(err)
	}
}

func TestNotifyByChannelAndSkipOwn(t *testing.T) {
	t.Parallel()
	other := testenv.Pool(t) // another process
	mine, own := ownPool(t, other)
	n, err := notifier.New(&notifier.Config{ConnConfig: other.Config().ConnConfig, Own: own})
	if err != nil {
		t.Fatal(err)
	}
	var all, notOwn, elsewhere events
	n.Subscribe(all.sub("a", false))
	n.Subscribe(notOwn.sub("a", true))
	n.Subscribe(elsewhere.sub("b", false))
	start(t, n)
	testenv.WaitFor(t, wait, "Up on every subscription", func() bool {
		_, u1, _ := all.snapshot()
		_, u2, _ := notOwn.snapshot()
		_, u3, _ := elsewhere.snapshot()
		return u1 == 1 && u2 == 1 && u3 == 1 && n.Listening()
	})
	notify(t, mine, "a", "from me")
	notify(t, other, "a", "from elsewhere")
	notify(t, other, "b", "on b")
	testenv.WaitFor(t, wait, "all three delivered", func() bool {
		return all.has("from elsewhere") && notOwn.has("from elsewhere") && elsewhere.has("on b")
	})
	// One connection delivers in order: "from me" came first.
	if !all.has("from me") {
		t.Error("subscription without SkipOwn missed the own notification")
	}
	if notOwn.has("from me") {
		t.Error("SkipOwn subscription got this process's own notification")
	}
	if got, _, _ := elsewhere.snapshot(); len(got) != 1 {
		t.Errorf("channel b got %q, want only its own notification", got)
	}
}

func TestSubscribeAndUnsubscribeWhileRunning(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	n, err := notifier.New(&notifier.Config{ConnConfig: pool.Config().ConnConfig})
	if err != nil {
		t.Fatal(err)
	}
	var marker events
	n.Subscribe(marker.sub("marker", false))
	start(t, n)
	testenv.WaitFor(t, wait, "listening", n.Listening)

	var late events
	unsubscribe := late.sub("late", false)
	stop := n.Subscribe(unsubscribe)
	testenv.WaitFor(t, wait, "Up of a subscription added while running", func() bool {
		_, ups, _ := late.snapshot()
		return ups == 1
	})
	notify(t, pool, "late", "1")
	testenv.WaitFor(t, wait, "notification on the new channel", func() bool { return late.has("1") })

	stop()
	stop() // idempotent
	// Once the UNLISTEN is done nothing more arrives on "late"; the marker
	// sent after it proves the notifier has read past anything sent before.
	testenv.WaitFor(t, wait, "unsubscribed", func() bool {
		notify(t, pool, "late", "2")
		notify(t, pool, "marker", "m")
		return marker.has("m")
	})
	before, _, _ := late.snapshot()
	notify(t, pool, "late", "3")
	notify(t, pool, "marker", "m2")
	testenv.WaitFor(t, wait, "second marker", func() bool { return marker.has("m2") })
	if after, _, _ := late.snapshot(); len(after) != len(before) || late.has("3") {
		t.Fatalf("unsubscribed callback still called: %q", after)
	}
}

// TestReconnectCatchUp kills the LISTEN backend with pg_terminate_backend:
// every subscriber hears Down, then Up again (its catch-up) once the
// notifier has reconnected, and notifications flow again.
func TestReconnectCatchUp(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	const app = "notifier_reconnect_test"
	n, err := notifier.New(&notifier.Config{ConnConfig: pool.Config().ConnConfig, ApplicationName: app})
	if err != nil {
		t.Fatal(err)
	}
	var e events
	n.Subscribe(e.sub("c", false))
	start(t, n)
	testenv.WaitFor(t, wait, "first Up", func() bool { _, ups, _ := e.snapshot(); return ups == 1 })
	notify(t, pool, "c", "before")
	testenv.WaitFor(t, wait, "before", func() bool { return e.has("before") })
	if got := n.Reconnects(); got != 0 {
		t.Fatalf("Reconnects() = %d before any loss, want 0", got)
	}

	var killed int
	if err := pool.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name = $1 AND datname = current_database()`, app).Scan(&killed); err != nil {
		t.Fatal(err)
	}
	if killed != 1 {
		t.Fatalf("terminated %d LISTEN backends, want 1", killed)
	}
	testenv.WaitFor(t, wait, "Down, then Up again after the reconnect", func() bool {
		_, ups, downs := e.snapshot()
		return len(downs) >= 1 && ups == 2 && n.Listening()
	})
	if _, _, downs := e.snapshot(); downs[0] == nil {
		t.Fatal("Down after a lost connection carried no error")
	}
	if got := n.Reconnects(); got != 1 {
		t.Fatalf("Reconnects() = %d after one lost connection, want 1", got)
	}
	notify(t, pool, "c", "after")
	testenv.WaitFor(t, wait, "after the reconnect", func() bool { return e.has("after") })
}

func TestStopAndRestart(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	n, err := notifier.New(&notifier.Config{ConnConfig: pool.Config().ConnConfig})
	if err != nil {
		t.Fatal(err)
	}
	var e events
	n.Subscribe(e.sub("r", false))
	for run := 1; run <= 2; run++ {
		if err := n.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, wait, "Up", func() bool { _, ups, _ := e.snapshot(); return ups == run })
		if err := n.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		if n.Listening() {
			t.Fatal("listening after Stop")
		}
		if _, _, downs := e.snapshot(); len(downs) != run || downs[run-1] != nil {
			t.Fatalf("downs after Stop %d: %v, want a nil Down per Stop", run, downs)
		}
	}
	if _, err := notifier.New(nil); !errors.Is(err, notifier.ErrInvalidConfig) {
		t.Fatalf("New(nil) = %v, want ErrInvalidConfig", err)
	}
}

// selfChecks records OnSelfCheck's outcomes.
type selfChecks struct {
	mu  sync.Mutex
	got []bool
}

func (s *selfChecks) on(ok bool) { s.mu.Lock(); s.got = append(s.got, ok); s.mu.Unlock() }

func (s *selfChecks) snapshot() []bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]bool(nil), s.got...)
}

// The self-check passes on a direct connection and through a real PgBouncer
// in session mode, and fails, loudly, through one in transaction mode,
// where LISTEN cannot work; either way the notifier keeps running.
func TestSelfCheck(t *testing.T) {
	t.Parallel()
	direct := testenv.Database(t)
	u, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	session, err := pgbouncerproc.Start(context.Background(), &pgbouncerproc.Options{Upstream: u.Host, Mode: pgbouncerproc.ModeSession})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = session.Close() })
	for _, tc := range []struct {
		name   string
		url    string
		wantOK bool
	}{
		{"direct", direct, true},
		{"session pooler", session.Rewrite(direct), true},
		{"transaction pooler", testenv.PgBouncer(t).Rewrite(direct), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cc, err := pgx.ParseConfig(tc.url)
			if err != nil {
				t.Fatal(err)
			}
			var logs testenv.SyncBuffer
			var checks selfChecks
			n, err := notifier.New(&notifier.Config{
				ConnConfig: cc, SelfCheckFix: "set --the-fix", OnSelfCheck: checks.on,
				Logger: slog.New(slog.NewTextHandler(&logs, nil)),
			})
			if err != nil {
				t.Fatal(err)
			}
			var ev events
			n.Subscribe(ev.sub("a", false))
			start(t, n)
			testenv.WaitFor(t, wait, "the self-check's outcome", func() bool { return len(checks.snapshot()) > 0 })
			if got := checks.snapshot(); got[0] != tc.wantOK || n.SelfCheckOK() != tc.wantOK {
				t.Fatalf("self-check outcome %v, SelfCheckOK %v; want %v; log:\n%s", got, n.SelfCheckOK(), tc.wantOK, logs.String())
			}
			warned := strings.Contains(logs.String(), "LISTEN SELF-CHECK FAILED")
			if warned == tc.wantOK {
				t.Errorf("warning logged = %v with the check ok = %v; log:\n%s", warned, tc.wantOK, logs.String())
			}
			if !tc.wantOK {
				for _, want := range []string{"transaction mode", "fix=\"set --the-fix\""} {
					if !strings.Contains(logs.String(), want) {
						t.Errorf("warning does not name %q; log:\n%s", want, logs.String())
					}
				}
			}
			// Still up (the subscribers poll through a pooler).
			if !n.Listening() {
				t.Error("notifier not listening after the self-check")
			}
			_, ups, _ := ev.snapshot()
			if ups == 0 {
				t.Error("subscription never got Up")
			}
		})
	}
}

// A self-check that is off never reports.
func TestSelfCheckOff(t *testing.T) {
	t.Parallel()
	p := testenv.Pool(t)
	var checks selfChecks
	n, err := notifier.New(&notifier.Config{ConnConfig: p.Config().ConnConfig, SelfCheckTimeout: -1, OnSelfCheck: checks.on})
	if err != nil {
		t.Fatal(err)
	}
	var ev events
	n.Subscribe(ev.sub("a", false))
	start(t, n)
	testenv.WaitFor(t, wait, "Up", func() bool { _, ups, _ := ev.snapshot(); return ups > 0 })
	notify(t, p, "a", "x")
	testenv.WaitFor(t, wait, "the notification", func() bool { return ev.has("x") })
	if got := checks.snapshot(); len(got) != 0 || n.SelfCheckOK() {
		t.Errorf("self-check off reported %v (ok %v)", got, n.SelfCheckOK())
	}
}
