package outbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/outbox"
)

// InTx commits and wakes the relay: with an hour's poll the event is
// published only because Committed was called.
func TestWriterInTxWakesTheRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w, rec, r := setupRelay(t, outbox.WakeAfterCommit, outbox.RelayConfig{PollInterval: time.Hour})
	startRelay(t, r)
	testenv.WaitFor(t, 5*time.Second, "relay listening", r.Listening)
	if _, err := r.RunOnce(ctx); err != nil { // the start's pass is done
		t.Fatal(err)
	}
	for _, id := range []string{"tx1", "tx2"} {
		if err := w.InTx(ctx, pool, func(tx pgx.Tx) error { return w.Enqueue(ctx, tx, ev(id)) }); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 5*time.Second, "published "+id, func() bool { return rec.has(id) })
	}
	// The Publisher sees a row before its pass deletes it.
	testenv.WaitFor(t, 5*time.Second, "published rows deleted", func() bool { return unsent(t, pool) == 0 })
	// A rolled-back fn: nothing stored, its error returned.
	err := w.InTx(ctx, pool, func(tx pgx.Tx) error {
		if err := w.Enqueue(ctx, tx, ev("rolled-back")); err != nil {
			return err
		}
		return context.Canceled
	})
	if err != context.Canceled || unsent(t, pool) != 0 {
		t.Fatalf("InTx of a failing fn = %v, %d unsent; want its error and nothing stored", err, unsent(t, pool))
	}
}

// A Writer whose Enqueues go on without Committed warns, once; one that
// is told Committed does not.
func TestWriterWarnsOnceWithoutCommitted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	var logs testenv.SyncBuffer
	w, err := outbox.NewWriter(pool, &outbox.WriterConfig{Table: testTable, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	outbox.SetForgetCommittedAfter(w, time.Millisecond)
	put := func(id string) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return w.Enqueue(ctx, tx, ev(id)) }); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 20 { // well past the 1 ms, in all
		put(fmt.Sprint("told-", i))
		w.Committed()
	}
	if strings.Contains(logs.String(), "without a Committed") {
		t.Fatalf("warned although every Enqueue was followed by Committed:\n%s", logs.String())
	}
	n := 0
	testenv.WaitFor(t, 10*time.Second, "the warning", func() bool {
		n++
		put(fmt.Sprint("forgot-", n))
		return strings.Contains(logs.String(), "without a Committed")
	})
	put("forgot-again")
	if c := strings.Count(logs.String(), "without a Committed"); c != 1 {
		t.Fatalf("warned %d times, want once:\n%s", c, logs.String())
	}
}
