package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/outbox"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// testTable is the outbox table every test creates in its own database.
const testTable = "ob.outbox"

// setup creates schema ob and the outbox table in a fresh database and
// returns a pool to it.
func setup(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool := testenv.Pool(t)
	if _, err := pool.Exec(context.Background(), "CREATE SCHEMA ob;\n"+outbox.TableDDL(testTable)); err != nil {
		t.Fatalf("create table: %v", err)
	}
	return pool
}

// setupWriter is setup with a started Writer of mode on the pool.
func setupWriter(t testing.TB, mode outbox.WakeMode) (*pgxpool.Pool, *outbox.Writer) {
	t.Helper()
	pool := setup(t)
	return pool, newWriter(t, pool, mode)
}

// newPool opens an extra pool (another "process") on the same database as
// pool, closed at test end.
func newPool(t testing.TB, pool *pgxpool.Pool, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg := pool.Config()
	cfg.MaxConns = maxConns
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("new pool: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// recorder is the test Publisher: it records every published message (the
// broker's log) and can be told to fail.
type recorder struct {
	mu    sync.Mutex
	calls int
	all   []outbox.Message
	// hook, if set, runs first on every call with the call number (1-based);
	// a non-nil error fails the publish without recording.
	hook func(ctx context.Context, call int, msgs []outbox.Message) error
}

func (r *recorder) Publish(ctx context.Context, msgs []outbox.Message) error {
	r.mu.Lock()
	r.calls++
	call, hook := r.calls, r.hook
	r.mu.Unlock()
	if hook != nil {
		if err := hook(ctx, call, msgs); err != nil {
			return err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, msgs...)
	return nil
}

// ids returns the IDs of every recorded publish, duplicates included.
func (r *recorder) ids() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, len(r.all))
	for i, m := range r.all {
		out[i] = m.ID
	}
	return out
}

// distinct returns the IDs in order of first publication (the effect of an
// idempotent broker).
func (r *recorder) distinct() []string {
	seen := map[string]bool{}
	var out []string
	for _, id := range r.ids() {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}

func (r *recorder) has(id string) bool { return slices.Contains(r.ids(), id) }

// ev builds an event with a small JSON payload.
func ev(id string) outbox.Event {
	return outbox.Event{ID: id, Name: "test.event", Payload: []byte(fmt.Sprintf(`{"id":%q}`, id))}
}

// enqueue writes events in one committed transaction and calls Committed.
func enqueue(t testing.TB, pool *pgxpool.Pool, w *outbox.Writer, events ...outbox.Event) {
	t.Helper()
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return w.Enqueue(ctx, tx, events...) })
	if err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	w.Committed()
}

func newWriter(t testing.TB, pool *pgxpool.Pool, mode outbox.WakeMode) *outbox.Writer {
	t.Helper()
	w, err := outbox.NewWriter(pool, &outbox.WriterConfig{Table: testTable, Mode: mode})
	if err != nil {
		t.Fatalf("new writer: %v", err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatalf("start writer: %v", err)
	}
	t.Cleanup(func() {
		if err := w.Stop(context.Background()); err != nil {
			t.Errorf("stop writer: %v", err)
		}
	})
	return w
}

func newRelay(t testing.TB, pool *pgxpool.Pool, cfg outbox.RelayConfig) *outbox.Relay {
	t.Helper()
	if cfg.Table == "" {
		cfg.Table = testTable
	}
	r, err := outbox.NewRelay(pool, &cfg)
	if err != nil {
		t.Fatalf("new relay: %v", err)
	}
	return r
}

// setupRelay is setup with a started writer in mode and a relay of cfg
// (its Table defaulted to the test's) publishing to a new recorder, which
// replaces cfg.Publisher.
func setupRelay(t testing.TB, mode outbox.WakeMode, cfg outbox.RelayConfig) (*pgxpool.Pool, *outbox.Writer, *recorder, *outbox.Relay) {
	t.Helper()
	pool := setup(t)
	rec := &recorder{}
	cfg.Publisher = rec
	return pool, newWriter(t, pool, mode), rec, newRelay(t, pool, cfg)
}

func startRelay(t testing.TB, r *outbox.Relay) {
	t.Helper()
	if err := r.Start(context.Background()); err != nil {
		t.Fatalf("start relay: %v", err)
	}
	t.Cleanup(func() {
		if err := r.Stop(context.Background()); err != nil {
			t.Errorf("stop relay: %v", err)
		}
	})
}

type rowState struct {
	id        string
	sent      bool
	attempts  int
	lastError *string
}

// rows returns the outbox rows in id order.
func rows(t testing.TB, pool *pgxpool.Pool) []rowState {
	t.Helper()
	rs, err := pool.Query(context.Background(),
		"SELECT idempotency_key, sent_at IS NOT NULL, attempts, last_error FROM ob.outbox ORDER BY id")
	if err != nil {
		t.Fatalf("query outbox: %v", err)
	}
	out, err := pgx.CollectRows(rs, func(row pgx.CollectableRow) (rowState, error) {
		var s rowState
		err := row.Scan(&s.id, &s.sent, &s.attempts, &s.lastError)
		return s, err
	})
	if err != nil {
		t.Fatalf("collect outbox: %v", err)
	}
	return out
}

func unsent(t testing.TB, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(),
		"SELECT count(*) FROM ob.outbox WHERE sent_at IS NULL").Scan(&n); err != nil {
		t.Fatalf("count unsent: %v", err)
	}
	return n
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return string(xa) == string(ya)
}
