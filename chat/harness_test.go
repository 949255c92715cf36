package chat

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/outbox"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// testSecret is the HS256 secret of every harness service; testToken a
// token of user "tester" for every chat on both services.
var (
	testSecret = []byte("outboxchat test secret: 32 bytes or more")
	testToken  = sync.OnceValue(func() string {
		t, err := MintToken(testSecret, "tester", []string{Consumers, Workers}, ChatScope{All: true}, time.Hour)
		if err != nil {
			panic(err)
		}
		return t
	})
	// authClient sends testToken with every request.
	authClient = &http.Client{Transport: bearerTransport{}}
)

// bearerTransport adds "Authorization: Bearer <token>" (testToken unless
// the request has one).
type bearerTransport struct{}

func (bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Header.Get("Authorization") == "" {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+testToken())
	}
	return http.DefaultTransport.RoundTrip(r)
}

// wsOpts offers token as a WebSocket subprotocol, as the page does.
func wsOpts(token string) *websocket.DialOptions {
	return &websocket.DialOptions{Subprotocols: []string{wsProtocol, wsBearerPrefix + token}}
}

// harness runs both services in-process (chat.Serve in goroutines) on a
// fresh database of the shared private Postgres and a unique key prefix of
// the shared private Redis (or the given one).
type harness struct {
	t        testing.TB
	adminURL string
	admin    *pgxpool.Pool
	redisURL string
	prefix   string
	// secretFile holds testSecret: every service started has auth on.
	secretFile string
}

func newHarness(t testing.TB, redisURL string) *harness {
	t.Helper()
	return newHarnessOn(t, testenv.Database(t), redisURL)
}

// newHarnessOn is newHarness on the database of the superuser URL adminURL
// (e.g. a private server of the test's own).
func newHarnessOn(t testing.TB, adminURL, redisURL string) *harness {
	t.Helper()
	ctx := context.Background()
	admin, err := pgxpool.New(ctx, adminURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	for _, s := range []string{Consumers, Workers} {
		if err := Bootstrap(ctx, admin, s); err != nil {
			t.Fatal(err)
		}
		if _, err := Migrate(ctx, admin, s); err != nil {
			t.Fatal(err)
		}
	}
	if redisURL == "" {
		redisURL = testenv.RedisURL(t)
	}
	secretFile := filepath.Join(t.TempDir(), "jwt.secret")
	if err := os.WriteFile(secretFile, testSecret, 0o600); err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, adminURL: adminURL, admin: admin, redisURL: redisURL, prefix: testenv.Prefix(t), secretFile: secretFile}
}

// roleURL is the database URL for service's own role.
func (h *harness) roleURL(service string) string {
	u, err := url.Parse(h.adminURL)
	if err != nil {
		h.t.Fatal(err)
	}
	u.User = url.User(service)
	return u.String()
}

type running struct {
	base   string
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// rolePool is a pool of service's role on the harness database, closed
// when the test ends.
func (h *harness) rolePool(t testing.TB, service string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), h.roleURL(service))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// inboxConsumer is service's InboxHandler behind an inbox.Consumer on a
// rolePool, fed by a recordingSource; cfg may be nil.
func (h *harness) inboxConsumer(t testing.TB, service string, cfg *inbox.Config) (*pgxpool.Pool, *InboxHandler, *inbox.Consumer, *recordingSource) {
	t.Helper()
	pool := h.rolePool(t, service)
	ih, err := NewInboxHandler(service)
	if err != nil {
		t.Fatal(err)
	}
	src := &recordingSource{}
	c, err := inbox.NewConsumer(pool, src, ih, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return pool, ih, c, src
}

// start runs service with cfg adjusted by mutate; it returns once the HTTP
// server listens (or, without the api role, at once). It is stopped at
// cleanup.
func (h *harness) start(service string, mutate func(*Config)) *running {
	h.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	cfg := Config{
		Service: service, DatabaseURL: h.roleURL(service), RedisURL: h.redisURL,
		HTTPAddr: "127.0.0.1:0", RedisPrefix: h.prefix, LockDuration: 2 * time.Second,
		PollInterval: 200 * time.Millisecond,
		// Tests send from one IP faster than a person: limits off unless
		// a test sets them.
		Guard:     GuardConfig{IPRate: -1, UserRate: -1, SocketsPerUser: -1},
		Auth:      AuthConfig{SecretFile: h.secretFile},
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		Listening: func(a string) { addr <- a },
	}
	if testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(testWriter{h.t}, nil)).With("test_service", service)
	}
	if mutate != nil {
		mutate(&cfg)
	}
	r := &running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- Serve(ctx, cfg) }()
	h.t.Cleanup(r.stop)
	if !cfg.has(RoleAPI) {
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

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimSpace(p)))
	return len(p), nil
}

// send posts body to chat and fails the test unless it gets 201.
func send(t testing.TB, base string, chat int64, body string) Message {
	t.Helper()
	code, raw := post(t, base, fmt.Sprint(chat), `{"body":`+jsonString(body)+`}`)
	if code != http.StatusCreated {
		t.Fatalf("send %q: status %d: %s", body, code, raw)
	}
	var m Message
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("decode %s: %v", raw, err)
	}
	return m
}

func post(t testing.TB, base, chat, body string) (int, []byte) {
	t.Helper()
	resp, err := authClient.Post(base+"/api/chats/"+chat+"/messages", "application/json", bytes.NewBufferString(body))
	if err != nil {
		t.Fatalf("post: %v", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, raw
}

func jsonString(s string) string { b, _ := json.Marshal(s); return string(b) }

// watcher is a WebSocket client of one room that records every frame.
type watcher struct {
	mu       sync.Mutex
	frames   []Message
	receipts []ReceiptFrame
	cancel   context.CancelFunc
	done     chan struct{}
}

func watch(t testing.TB, base string, chat int64) *watcher {
	t.Helper()
	return watchURL(t, context.Background(), base+fmt.Sprintf("/ws?chat_id=%d", chat))
}

// from returns the frames of messages sent by service, in arrival order.
func (w *watcher) from(service string) []Message {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []Message
	for _, m := range w.frames {
		if m.From == service {
			out = append(out, m)
		}
	}
	return out
}

// lastReceipt returns the receipt frame with the highest upto_seq for
// messages of service, or a zero frame.
func (w *watcher) lastReceipt(service string) ReceiptFrame {
	w.mu.Lock()
	defer w.mu.Unlock()
	var best ReceiptFrame
	for _, r := range w.receipts {
		if r.From == service && r.UptoSeq > best.UptoSeq {
			best = r
		}
	}
	return best
}

// waitSeqs waits until the watcher has n frames from service and then
// checks they are exactly seqs 1..n of chat, in order, each once.
func (w *watcher) waitSeqs(t testing.TB, service string, n int, timeout time.Duration) []Message {
	t.Helper()
	testenv.WaitFor(t, timeout, fmt.Sprintf("%d messages from %s on the socket", n, service), func() bool {
		return len(w.from(service)) >= n
	})
	got := w.from(service)
	if len(got) != n {
		t.Fatalf("got %d frames from %s, want %d (duplicates?)", len(got), service, n)
	}
	for i, m := range got {
		if m.Seq != int64(i+1) {
			t.Fatalf("frame %d from %s has seq %d, want %d (order or duplicate broken): %+v", i, service, m.Seq, i+1, got)
		}
	}
	return got
}

func (h *harness) count(t testing.TB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := h.admin.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

func watchURL(t testing.TB, ctx context.Context, u string) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	c, _, err := websocket.Dial(ctx, "ws"+u[len("http"):], wsOpts(testToken()))
	if err != nil {
		cancel()
		t.Fatalf("dial %s: %v", u, err)
	}
	w := &watcher{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer c.CloseNow()
		for {
			_, data, err := c.Read(ctx)
			if err != nil {
				return
			}
			var r struct {
				Type        string    `json:"type"`
				ChatID      int64     `json:"chat_id"`
				From        string    `json:"from"`
				UptoSeq     int64     `json:"upto_seq"`
				DeliveredAt time.Time `json:"delivered_at"`
			}
			if json.Unmarshal(data, &r) == nil && r.Type == "receipt" {
				w.mu.Lock()
				w.receipts = append(w.receipts, ReceiptFrame(r))
				w.mu.Unlock()
				continue
			}
			var m Message
			if json.Unmarshal(data, &m) == nil && m.ID != "" {
				w.mu.Lock()
				w.frames = append(w.frames, m)
				w.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-w.done })
	return w
}

func http_get(u string) (string, error) {
	resp, err := authClient.Get(u)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %d %s", u, resp.StatusCode, b)
	}
	return string(b), err
}

func xaddArgs(stream, id string, payload []byte) *redis.XAddArgs {
	return &redis.XAddArgs{Stream: stream, Values: []any{"id", id, "name", EventMessageCreated, "payload", string(payload)}}
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

// holdChatLock takes chat's send lock of service in a transaction of
// another session (the admin pool) and returns it: the lock is held until
// the caller ends it.
func (h *harness) holdChatLock(t testing.TB, service string, chat int64) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := h.admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(`+ChatLockSQL(service, "$1::bigint")+`)`, chat); err != nil {
		_ = tx.Rollback(ctx)
		t.Fatal(err)
	}
	return tx
}
