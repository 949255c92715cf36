package outbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/outbox"
)

// QueueEnqueue puts the same insert (and in-tx NOTIFY) as Enqueue onto the
// caller's pipelined batch; an invalid event queues nothing.
func TestQueueEnqueueRidesOnTheCallersBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	for _, mode := range []outbox.WakeMode{outbox.WakeAfterCommit, outbox.WakeInTx} {
		w := newWriter(t, pool, mode)
		b := &pgx.Batch{}
		if n, err := w.QueueEnqueue(b, ev("ok-"+mode.String()), outbox.Event{ID: "bad", Name: "x", Payload: []byte("{")}); !errors.Is(err, outbox.ErrInvalidEvent) || n != 0 || b.Len() != 0 {
			t.Fatalf("%s: invalid event: n %d, err %v, batch %d statements; want nothing queued", mode, n, err, b.Len())
		}
		b.Queue("BEGIN")
		n, err := w.QueueEnqueue(b, ev("a-"+mode.String()), ev("b-"+mode.String()))
		want := map[outbox.WakeMode]int{outbox.WakeAfterCommit: 1, outbox.WakeInTx: 2}[mode]
		if err != nil || n != want {
			t.Fatalf("%s: QueueEnqueue = %d, %v; want %d statements", mode, n, err, want)
		}
		b.Queue("COMMIT")
		if err := pool.SendBatch(ctx, b).Close(); err != nil {
			t.Fatalf("%s: send batch: %v", mode, err)
		}
	}
	got := rows(t, pool)
	if len(got) != 4 || got[0].id != "a-after_commit" || got[3].id != "b-in_tx" {
		t.Fatalf("outbox rows %+v, want a and b of each mode, in order", got)
	}
}
