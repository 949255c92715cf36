package outbox_test

import (
	"context"
	"errors"
	"maps"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/outbox"
)

func TestCheckHeaders(t *testing.T) {
	t.Parallel()
	many := map[string]string{}
	for i := range outbox.MaxHeaders + 1 {
		many[strings.Repeat("k", i+1)] = "v"
	}
	full := map[string]string{}
	for i := range outbox.MaxHeaders {
		full[strings.Repeat("k", i+1)] = strings.Repeat("v", outbox.MaxHeaderValueBytes)
	}
	for _, tc := range []struct {
		name string
		h    map[string]string
		ok   bool
	}{
		{"nil", nil, true},
		{"empty", map[string]string{}, true},
		{"traceparent", map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}, true},
		{"at every limit", full, true},
		{"empty value", map[string]string{"tenant": ""}, true},
		{"key of max length", map[string]string{strings.Repeat("a", outbox.MaxHeaderKeyBytes): "v"}, true},
		{"too many", many, false},
		{"empty key", map[string]string{"": "v"}, false},
		{"key too long", map[string]string{strings.Repeat("a", outbox.MaxHeaderKeyBytes+1): "v"}, false},
		{"space in key", map[string]string{"a b": "v"}, false},
		{"non-ASCII key", map[string]string{"é": "v"}, false},
		{"value too long", map[string]string{"k": strings.Repeat("v", outbox.MaxHeaderValueBytes+1)}, false},
		{"invalid UTF-8", map[string]string{"k": "\xff"}, false},
		{"NUL in value", map[string]string{"k": "a\x00b"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := outbox.CheckHeaders(tc.h)
			if tc.ok != (err == nil) || (err != nil && !errors.Is(err, outbox.ErrInvalidHeaders)) {
				t.Fatalf("CheckHeaders = %v, want ok %v (or ErrInvalidHeaders)", err, tc.ok)
			}
		})
	}
}

// TestEnqueueHeaders: headers are stored with the row and handed to the
// Publisher, for a single and a multi-event enqueue, in both statement
// paths (Enqueue, QueueEnqueue); events without headers come back nil.
func TestEnqueueHeaders(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w, rec, r := setupRelay(t, outbox.WakeNone, outbox.RelayConfig{})
	h1 := map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tenant": "acme"}
	h2 := map[string]string{"schema": "2"}
	one := ev("one")
	one.Headers = h1
	many := []outbox.Event{ev("a"), ev("b"), ev("c")}
	many[0].Headers, many[2].Headers = h2, map[string]string{} // b none, c empty
	enqueue(t, pool, w, one)
	enqueue(t, pool, w, many...)
	queued := ev("queued")
	queued.Headers = h2
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		if _, err := w.QueueEnqueue(b, queued); err != nil {
			return err
		}
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		t.Fatalf("queue enqueue: %v", err)
	}
	if n, err := r.RunOnce(ctx); err != nil || n != 5 {
		t.Fatalf("RunOnce = %d, %v; want 5", n, err)
	}
	want := map[string]map[string]string{"one": h1, "a": h2, "b": nil, "c": nil, "queued": h2}
	for _, m := range rec.all {
		if !maps.Equal(m.Headers, want[m.ID]) || (want[m.ID] == nil) != (m.Headers == nil) {
			t.Errorf("message %s: headers %v, want %v", m.ID, m.Headers, want[m.ID])
		}
	}
}

// TestEnqueueHeadersOverLimit: an event whose headers break a limit is
// refused with both sentinels before anything is sent, so the transaction
// stays usable and no row is written.
func TestEnqueueHeadersOverLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w := setupWriter(t, outbox.WakeNone)
	bad := ev("bad")
	bad.Headers = map[string]string{"k": strings.Repeat("v", outbox.MaxHeaderValueBytes+1)}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		err := w.Enqueue(ctx, tx, ev("good"), bad)
		if !errors.Is(err, outbox.ErrInvalidHeaders) || !errors.Is(err, outbox.ErrInvalidEvent) {
			t.Errorf("Enqueue = %v, want ErrInvalidHeaders and ErrInvalidEvent", err)
		}
		if _, err := w.QueueEnqueue(&pgx.Batch{}, bad); !errors.Is(err, outbox.ErrInvalidHeaders) {
			t.Errorf("QueueEnqueue = %v, want ErrInvalidHeaders", err)
		}
		_, err = tx.Exec(ctx, "SELECT 1") // still usable
		return err
	})
	if err != nil {
		t.Fatalf("transaction: %v", err)
	}
	if n := unsent(t, pool); n != 0 {
		t.Fatalf("%d rows written, want 0", n)
	}
}

// TestHeadersDDL: a table made by the TableDDL before headers existed
// works with this Writer and Relay once HeadersDDL has run.
func TestHeadersDDL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	old := strings.Replace(outbox.TableDDL(testTable), ",\n  headers         jsonb", "", 1)
	if strings.Contains(old, "headers") {
		t.Fatalf("could not make the old DDL: %s", old)
	}
	if _, err := pool.Exec(ctx, "CREATE SCHEMA ob;\n"+old); err != nil {
		t.Fatalf("old table: %v", err)
	}
	w := newWriter(t, pool, outbox.WakeNone)
	e := ev("x")
	e.Headers = map[string]string{"k": "v"}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return w.Enqueue(ctx, tx, e) }); err == nil {
		t.Fatal("Enqueue into a table without the headers column succeeded; the test would prove nothing")
	}
	if _, err := pool.Exec(ctx, outbox.HeadersDDL(testTable)); err != nil {
		t.Fatalf("HeadersDDL: %v", err)
	}
	enqueue(t, pool, w, e)
	rec := &recorder{}
	r := newRelay(t, pool, outbox.RelayConfig{Publisher: rec})
	if n, err := r.RunOnce(ctx); err != nil || n != 1 || rec.all[0].Headers["k"] != "v" {
		t.Fatalf("RunOnce = %d, %v, published %+v", n, err, rec.all)
	}
}
