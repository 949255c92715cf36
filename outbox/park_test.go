package outbox_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/outbox"
)

// poisonPublisher publishes every message but the one with ID bad, for
// which it returns a MessageError while failing is set.
type poisonPublisher struct {
	bad     string
	failing atomic.Bool
	mu      sync.Mutex
	got     []string
}

func (p *poisonPublisher) Publish(_ context.Context, msgs []outbox.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range msgs {
		if m.ID == p.bad && p.failing.Load() {
			return &outbox.MessageError{RowID: m.RowID, Err: errors.New("refused by the broker: poison")}
		}
		p.got = append(p.got, m.ID)
	}
	return nil
}

func (p *poisonPublisher) published() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.got)
}

// A row the Publisher blames holds back the rows behind it (order) while it
// backs off, is parked after MaxAttempts failures of its own, after which
// the rows behind it go; Retry puts it back once (idempotent) and it is
// published last.
func TestPoisonRowIsParkedAndRetried(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w := setupWriter(t, outbox.WakeNone)
	pub := &poisonPublisher{bad: "p2"}
	pub.failing.Store(true)
	var mu sync.Mutex
	var kinds []outbox.RelayEventKind
	var parkedEv outbox.RelayEvent
	r := newRelay(t, pool, outbox.RelayConfig{Publisher: pub, MaxAttempts: 3,
		RetryBackoff: 20 * time.Millisecond, RetryBackoffMax: 40 * time.Millisecond,
		OnEvent: func(e outbox.RelayEvent) {
			mu.Lock()
			defer mu.Unlock()
			if e.Kind == outbox.EventMessageFailed || e.Kind == outbox.EventParked {
				kinds = append(kinds, e.Kind)
			}
			if e.Kind == outbox.EventParked {
				parkedEv = e
			}
		}})
	enqueue(t, pool, w, ev("p1"), ev("p2"), ev("p3"), ev("p4"))

	if n, err := r.RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("pass 1 = %d, %v; want 1 (p1), nil", n, err)
	}
	// Backing off: the next pass publishes nothing (p3 must not overtake p2).
	if n, err := r.RunOnce(ctx); err != nil || n != 0 {
		t.Fatalf("pass 2 (p2 backing off) = %d, %v; want 0, nil", n, err)
	}
	if got := pub.published(); !slices.Equal(got, []string{"p1"}) {
		t.Fatalf("published %v while p2 backs off; want [p1]", got)
	}
	st, err := outbox.ReadStats(ctx, pool, testTable)
	if err != nil || st.Unsent != 3 || st.Parked != 0 {
		t.Fatalf("stats %+v, %v; want 3 unsent, 0 parked", st, err)
	}
	testenv.WaitFor(t, 30*time.Second, "p2 parked and p3, p4 published", func() bool {
		if _, err := r.RunOnce(ctx); err != nil {
			t.Fatalf("pass: %v", err)
		}
		return len(pub.published()) == 3
	})
	if got := pub.published(); !slices.Equal(got, []string{"p1", "p3", "p4"}) {
		t.Fatalf("published %v; want [p1 p3 p4]", got)
	}
	mu.Lock()
	if !slices.Equal(kinds, []outbox.RelayEventKind{outbox.EventMessageFailed, outbox.EventMessageFailed, outbox.EventParked}) ||
		parkedEv.MessageID != "p2" || parkedEv.Attempts != 3 || parkedEv.RowID == 0 {
		t.Errorf("events %v, parked %+v; want 2 failures then parked p2 after 3 attempts", kinds, parkedEv)
	}
	mu.Unlock()
	parked, err := outbox.Parked(ctx, pool, testTable, 0)
	if err != nil || len(parked) != 1 {
		t.Fatalf("Parked = %+v, %v; want p2", parked, err)
	}
	if p := parked[0]; p.ID != "p2" || p.Failures != 3 || p.Attempts != 3 || !strings.Contains(p.LastError, "poison") || p.ParkedAt.IsZero() {
		t.Fatalf("parked row %+v", p)
	}
	if st, err := outbox.ReadStats(ctx, pool, testTable); err != nil || st.Unsent != 0 || st.Parked != 1 {
		t.Fatalf("stats %+v, %v; want 0 unsent, 1 parked", st, err)
	}

	pub.failing.Store(false) // the fix
	re, err := outbox.Retry(ctx, pool, testTable, "", nil)
	if err != nil || len(re) != 1 || re[0].ID != "p2" || re[0].OldRowID != parked[0].RowID || re[0].NewRowID <= parked[0].RowID {
		t.Fatalf("Retry = %+v, %v; want p2 under a new, higher id", re, err)
	}
	if again, err := outbox.Retry(ctx, pool, testTable, "", []int64{parked[0].RowID}); err != nil || len(again) != 0 {
		t.Fatalf("second Retry = %+v, %v; want nothing (idempotent)", again, err)
	}
	if n, err := r.RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("pass after retry = %d, %v; want 1", n, err)
	}
	if got := pub.published(); !slices.Equal(got, []string{"p1", "p3", "p4", "p2"}) {
		t.Fatalf("published %v; want [p1 p3 p4 p2]", got)
	}
	if st, err := outbox.ReadStats(ctx, pool, testTable); err != nil || st != (outbox.Stats{}) {
		t.Fatalf("stats %+v, %v; want empty", st, err)
	}
}

// A running relay parks the poison row by itself, without a wake-up (the
// retry wait schedules the next pass), and failures of a whole pass
// (broker down) never park anything.
func TestRunningRelayParksOnlyPoison(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w := setupWriter(t, outbox.WakeNone)
	var down atomic.Int32
	down.Store(5)
	pub := &poisonPublisher{bad: "bad"}
	pub.failing.Store(true)
	r := newRelay(t, pool, outbox.RelayConfig{MaxAttempts: 2, DisableListen: true, PollInterval: time.Hour,
		Publisher: outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) error {
			if down.Add(-1) >= 0 {
				return errors.New("broker down")
			}
			return pub.Publish(ctx, msgs)
		})})
	enqueue(t, pool, w, ev("a"), ev("bad"), ev("c"))
	startRelay(t, r)
	testenv.WaitFor(t, 30*time.Second, "a and c published, bad parked", func() bool {
		return slices.Equal(pub.published(), []string{"a", "c"})
	})
	parked, err := outbox.Parked(ctx, pool, testTable, 10)
	if err != nil || len(parked) != 1 || parked[0].ID != "bad" || parked[0].Failures != 2 || parked[0].Attempts != 7 {
		t.Fatalf("Parked = %+v, %v; want bad with 2 failures of its own and 7 attempts (5 broker down)", parked, err)
	}
	if r.LastPass().IsZero() {
		t.Error("LastPass is zero after passes")
	}
}
