package server

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

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
