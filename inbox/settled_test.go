package inbox_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/inbox"
)

// A malformed delivery held by a slow consumer while another one took it
// over (after the lock duration) and dead-lettered it: the slow one's
// dead letter of its stale copy is refused by the source with ErrSettled,
// and the slow consumer counts no dead letter and reports no
// EventDeadLettered. The dead-letter stream holds the entry once.
func TestStaleDeadLetterIsNotCounted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	slow, other := e.sourceLocked(t, "slow", 100*time.Millisecond), e.sourceLocked(t, "other", 100*time.Millisecond)
	e.add(t, rawJob(`{"id": "not json`))
	stale := fetchAll(t, slow, 1) // held while, say, Postgres is down
	got := fetchAll(t, other, 1)  // taken over after the lock duration
	if err := e.consumer(t, other, testHandler, nil).ProcessBatch(ctx, got); err != nil {
		t.Fatal(err)
	}
	var deadLettered atomic.Int64
	slowC := e.consumer(t, slow, testHandler, &inbox.Config{OnEvent: func(ev inbox.Event) {
		if ev.Kind == inbox.EventDeadLettered {
			deadLettered.Add(1)
		}
	}})
	if err := slowC.ProcessBatch(ctx, stale); err != nil {
		t.Fatal(err)
	}
	if err := slow.DeadLetter(ctx, stale[0], "malformed"); !errors.Is(err, inbox.ErrSettled) {
		t.Fatalf("DeadLetter of the stale copy: %v, want ErrSettled", err)
	}
	if s := slowC.Stats(); s.DeadLettered != 0 {
		t.Fatalf("the slow consumer's stats %+v, want no dead letter", s)
	}
	if n := deadLettered.Load(); n != 0 {
		t.Fatalf("the slow consumer reported %s %d times for a dead letter it did not make", inbox.EventDeadLettered, n)
	}
	if n := e.deadLen(t); n != 1 {
		t.Fatalf("dead-letter stream holds %d entries, want 1", n)
	}
	if n := e.pending(t); n != 0 {
		t.Fatalf("%d entries pending, want 0", n)
	}
	if recs := e.logs.records(t, "delivery to dead-letter already settled by another consumer"); len(recs) != 1 {
		t.Fatalf("settled log records = %v, want one", recs)
	}
}
