package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/auth"
	"github.com/outboxchat/outboxchat/chat/httpapi"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/outbox"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// harness runs both services in-process (Serve in goroutines) on a
// chattest.Harness.
type harness struct {
	*chattest.Harness
	t testing.TB
}

func newHarness(t testing.TB, redisURL string) *harness {
	t.Helper()
	return &harness{Harness: chattest.New(t, redisURL), t: t}
}

// newHarnessOn is newHarness on the database of the superuser URL adminURL
// (e.g. a private server of the test's own).
func newHarnessOn(t testing.TB, adminURL, redisURL string) *harness {
	t.Helper()
	return &harness{Harness: chattest.NewOn(t, adminURL, redisURL), t: t}
}

type running struct {
	base   string
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// start runs service with cfg adjusted by mutate; it returns once the HTTP
// server listens (or, without the api role, at once). It is stopped at
// cleanup.
func (h *harness) start(service string, mutate func(*Config)) *running {
	h.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	cfg := Config{
		Service: service, DatabaseURL: h.RoleURL(service), RedisURL: h.RedisURL,
		RedisPrefix: h.Prefix, LockDuration: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		API: APIConfig{
			HTTPAddr: "127.0.0.1:0",
			// Tests send from one IP faster than a person: limits off
			// unless a test sets them.
			Guard:     httpapi.GuardConfig{IPRate: -1, UserRate: -1, SocketsPerUser: -1},
			Auth:      auth.Config{SecretFile: h.SecretFile},
			Listening: func(a string) { addr <- a },
		},
		Relay: RelayConfig{PollInterval: 200 * time.Millisecond},
	}
	if testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(chattest.TestWriter{T: h.t}, nil)).With("test_service", service)
	}
	if mutate != nil {
		mutate(&cfg)
	}
	r := &running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- Serve(ctx, cfg) }()
	h.t.Cleanup(r.stop)
	if roles := cfg.WithDefaults(); !roles.has(RoleAPI) {
		return r
	}
	select {
	case a := <-addr:
		r.base = "http://" + a
	case err := <-r.done:
		r.done <- err // for the cleanup's stop
		h.t.Fatalf("serve %s: %v", service, err)
	case <-time.After(20 * time.Second):
		h.t.Fatalf("serve %s: not listening after 20 s", service)
	}
	return r
}

// startBoth is a test's harness with both services running, every role
// and the defaults.
func startBoth(t testing.TB) (h *harness, cons, work *running) {
	t.Helper()
	h = newHarness(t, "")
	return h, h.start(chat.Consumers, nil), h.start(chat.Workers, nil)
}

// sendsArrive sends three messages to chatID through b and waits (each
// within d) for a WebSocket client of a to get them, one after another.
func sendsArrive(t *testing.T, a, b *running, chatID int64, d time.Duration) *chattest.Watcher {
	t.Helper()
	w := chattest.Watch(t, a.base, chatID)
	for i := 1; i <= 3; i++ {
		chattest.Send(t, b.base, chatID, fmt.Sprint("via b ", i))
		w.WaitSeqs(t, chat.Consumers, i, d)
	}
	return w
}

// startAPI is start with the api role alone; mutate may be nil.
func (h *harness) startAPI(service string, mutate func(*Config)) *running {
	h.t.Helper()
	return h.start(service, func(c *Config) {
		c.Roles = []string{RoleAPI}
		if mutate != nil {
			mutate(c)
		}
	})
}

// lockMessages locks consumers.messages from a session of its own until
// the returned transaction ends (rolled back when the test ends at the
// latest).
func (h *harness) lockMessages(t testing.TB) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := h.Admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(ctx, `LOCK TABLE consumers.messages IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	return tx
}

// noMessagesStored fails the test unless consumers.messages is empty.
func (h *harness) noMessagesStored(t testing.TB) {
	t.Helper()
	if n := h.Count(t, `SELECT count(*) FROM consumers.messages`); n != 0 {
		t.Fatalf("%d messages stored", n)
	}
}

func (r *running) stop() {
	r.once.Do(func() {
		r.cancel()
		<-r.done
	})
}

// testHooks is a Hooks whose nil funcs leave their part alone.
type testHooks struct {
	publisher func(outbox.Publisher) outbox.Publisher
	source    func(inbox.Source) inbox.Source
	handler   func(inbox.Handler) inbox.Handler
}

func (h testHooks) Publisher(p outbox.Publisher) outbox.Publisher {
	if h.publisher == nil {
		return p
	}
	return h.publisher(p)
}

func (h testHooks) Source(s inbox.Source) inbox.Source {
	if h.source == nil {
		return s
	}
	return h.source(s)
}

func (h testHooks) Handler(x inbox.Handler) inbox.Handler {
	if h.handler == nil {
		return x
	}
	return h.handler(x)
}
