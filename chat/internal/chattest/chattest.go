package chattest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/auth"
	"github.com/outboxchat/outboxchat/chat/schema"

	"github.com/coder/websocket"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/internal/testenv"
)

// Secret is the HS256 secret of every Harness service; Token a
// token of user "tester" for every chat on both services.
var (
	Secret = []byte("outboxchat test secret: 32 bytes or more")
	Token  = sync.OnceValue(func() string {
		t, err := auth.MintToken(Secret, "tester", []string{chat.Consumers, chat.Workers}, auth.ChatScope{All: true}, time.Hour)
		if err != nil {
			panic(err)
		}
		return t
	})
	// AuthClient sends Token with every request.
	AuthClient = &http.Client{Transport: BearerTransport{}}
)

// BearerTransport adds "Authorization: Bearer <token>" (Token unless
// the request has one).
type BearerTransport struct{}

func (BearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Header.Get("Authorization") == "" {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+Token())
	}
	return http.DefaultTransport.RoundTrip(r)
}

// WSOpts offers token as a WebSocket subprotocol, as the page does.
func WSOpts(token string) *websocket.DialOptions {
	return &websocket.DialOptions{Subprotocols: []string{chat.WSProtocol, chat.WSBearerPrefix + token}}
}

// Harness is a test's share of the private servers: a fresh database of
// the shared private Postgres with both services' schemas migrated, a
// unique key prefix of the shared private Redis (or the given one), and a
// JWT secret file holding Secret. The services themselves are started by
// the tests of package server.
type Harness struct {
	t testing.TB
	// AdminURL is the superuser URL of the test's database; Admin a pool
	// on it, closed when the test ends.
	AdminURL string
	Admin    *pgxpool.Pool
	// RedisURL is the Redis the test uses; Prefix its own key prefix.
	RedisURL string
	Prefix   string
	// SecretFile holds Secret: every service started with it has auth on.
	SecretFile string
}

// New is a Harness on a fresh database of the shared private Postgres and
// redisURL ("" means the shared private Redis). It needs the test binary's
// TestMain to run testenv.Main.
func New(t testing.TB, redisURL string) *Harness {
	t.Helper()
	return NewOn(t, testenv.Database(t), redisURL)
}

// bootstrapMu serialises the harnesses' Bootstrap calls.
var bootstrapMu sync.Mutex

// NewOn is New on the database of the superuser URL adminURL
// (e.g. a private server of the test's own).
func NewOn(t testing.TB, adminURL, redisURL string) *Harness {
	t.Helper()
	ctx := context.Background()
	admin, err := pgxpool.New(ctx, adminURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	for _, s := range []string{chat.Consumers, chat.Workers} {
		// One bootstrap at a time in the test binary: the roles are the
		// server's, shared by every test's database.
		bootstrapMu.Lock()
		err := schema.Bootstrap(ctx, admin, s)
		bootstrapMu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := schema.Migrate(ctx, admin, s); err != nil {
			t.Fatal(err)
		}
	}
	if redisURL == "" {
		redisURL = testenv.RedisURL(t)
	}
	secretFile := testenv.WriteFile(t, "jwt.secret", Secret)
	return &Harness{t: t, AdminURL: adminURL, Admin: admin, RedisURL: redisURL, Prefix: testenv.Prefix(t), SecretFile: secretFile}
}

// RoleURL is the database URL for service's own role.
func (h *Harness) RoleURL(service string) string {
	u, err := url.Parse(h.AdminURL)
	if err != nil {
		h.t.Fatal(err)
	}
	u.User = url.User(service)
	return u.String()
}

// RolePool is a pool of service's role on the Harness database, closed
// when the test ends.
func (h *Harness) RolePool(t testing.TB, service string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), h.RoleURL(service))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestWriter writes each log line to T.Log (verbose test runs).
type TestWriter struct{ T testing.TB }

func (w TestWriter) Write(p []byte) (int, error) {
	w.T.Log(string(bytes.TrimSpace(p)))
	return len(p), nil
}

// Send posts body to chat and fails the test unless it gets 201.
func Send(t testing.TB, base string, chatID int64, body string) chat.Message {
	t.Helper()
	code, raw := Post(t, base, fmt.Sprint(chatID), `{"body":`+JSONString(body)+`}`)
	if code != http.StatusCreated {
		t.Fatalf("send %q: status %d: %s", body, code, raw)
	}
	var m chat.Message
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("decode %s: %v", raw, err)
	}
	return m
}

// Post posts body (JSON) to chat chatID on base with the test token and
// returns the status and the answer.
func Post(t testing.TB, base, chatID, body string) (int, []byte) {
	t.Helper()
	code, raw, err := Answer(AuthClient.Post(base+"/api/chats/"+chatID+"/messages", "application/json", bytes.NewBufferString(body)))
	if err != nil {
		t.Fatalf("post: %v", err)
	}
	return code, raw
}

// Answer reads a whole answer and closes its body: it returns the status
// and the body, or err (the request's, passed on as from client.Do) or the
// read's error. Use it as Answer(client.Do(req)).
func Answer(resp *http.Response, err error) (int, []byte, error) {
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return resp.StatusCode, raw, err
}

// JSONString is s as a JSON string literal.
func JSONString(s string) string { b, _ := json.Marshal(s); return string(b) }

// Watcher is a WebSocket client of one room that records every frame.
type Watcher struct {
	mu       sync.Mutex
	frames   []chat.Message
	receipts []chat.ReceiptFrame
	typed    []typedFrame // frames with another "type" (edit, delete, read, typing, presence)
	cancel   context.CancelFunc
	done     chan struct{}
}

// Watch is WatchURL on the WebSocket of chat chatID at base.
func Watch(t testing.TB, base string, chatID int64) *Watcher {
	t.Helper()
	return WatchURL(t, context.Background(), base+fmt.Sprintf("/ws?chat_id=%d", chatID))
}

// typedFrame is a frame with a "type" other than "receipt".
type typedFrame struct {
	typ string
	raw []byte
}

// Typed returns the raw frames of type typ ("edit", "delete", "read",
// "typing", "presence"), in arrival order.
func (w *Watcher) Typed(typ string) [][]byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out [][]byte
	for _, f := range w.typed {
		if f.typ == typ {
			out = append(out, f.raw)
		}
	}
	return out
}

// Messages returns every message frame, in arrival order.
func (w *Watcher) Messages() []chat.Message {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]chat.Message(nil), w.frames...)
}

// from returns the frames of messages sent by service, in arrival order.
func (w *Watcher) From(service string) []chat.Message {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []chat.Message
	for _, m := range w.frames {
		if m.From == service {
			out = append(out, m)
		}
	}
	return out
}

// lastReceipt returns the receipt frame with the highest upto_seq for
// messages of service, or a zero frame.
func (w *Watcher) LastReceipt(service string) chat.ReceiptFrame {
	w.mu.Lock()
	defer w.mu.Unlock()
	var best chat.ReceiptFrame
	for _, r := range w.receipts {
		if r.From == service && r.UptoSeq > best.UptoSeq {
			best = r
		}
	}
	return best
}

// waitSeqs waits until the Watcher has n frames from service and then
// checks they are exactly seqs 1..n of chat, in order, each once.
func (w *Watcher) WaitSeqs(t testing.TB, service string, n int, timeout time.Duration) []chat.Message {
	t.Helper()
	defer func() {
		if t.Failed() { // also on WaitFor's Fatalf: say what did arrive
			var seqs []int64
			for _, m := range w.From(service) {
				seqs = append(seqs, m.Seq)
			}
			t.Logf("seqs from %s on the socket: %v", service, seqs)
		}
	}()
	testenv.WaitFor(t, timeout, fmt.Sprintf("%d messages from %s on the socket", n, service), func() bool {
		return len(w.From(service)) >= n
	})
	got := w.From(service)
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

// Count runs query (one integer column) on the admin pool and fails the
// test on an error.
func (h *Harness) Count(t testing.TB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := h.Admin.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// WatchURL dials the WebSocket at u (http or https URL) with the test
// token and records every message and receipt frame until the test ends
// or ctx does.
func WatchURL(t testing.TB, ctx context.Context, u string) *Watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	c, _, err := websocket.Dial(ctx, "ws"+u[len("http"):], WSOpts(Token()))
	if err != nil {
		cancel()
		t.Fatalf("dial %s: %v", u, err)
	}
	w := &Watcher{cancel: cancel, done: make(chan struct{})}
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
				w.receipts = append(w.receipts, chat.ReceiptFrame(r))
				w.mu.Unlock()
				continue
			}
			if r.Type != "" {
				w.mu.Lock()
				w.typed = append(w.typed, typedFrame{typ: r.Type, raw: append([]byte(nil), data...)})
				w.mu.Unlock()
				continue
			}
			var m chat.Message
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

// Get GETs u with the test token and returns the body of a 200 answer.
func Get(u string) (string, error) {
	code, b, err := Answer(AuthClient.Get(u))
	if err != nil {
		return "", err
	}
	if code != http.StatusOK {
		return "", fmt.Errorf("GET %s: %d %s", u, code, b)
	}
	return string(b), nil
}

// XAddArgs adds a message.created stream entry with job id id and payload
// to stream (unsigned: for tests of the worker's refusals).
func XAddArgs(stream, id string, payload []byte) *redis.XAddArgs {
	return &redis.XAddArgs{Stream: stream, Values: []any{"id", id, "name", chat.EventMessageCreated, "payload", string(payload)}}
}

// holdChatLock takes chat's Send lock of service in a transaction of
// another session (the admin pool) and returns it: the lock is held until
// the caller ends it.
func (h *Harness) HoldChatLock(t testing.TB, service string, chatID int64) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := h.Admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(`+schema.ChatLockSQL(service, "$1::bigint")+`)`, chatID); err != nil {
		_ = tx.Rollback(ctx)
		t.Fatal(err)
	}
	return tx
}
