package passloop

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/internal/testenv"
)

// script runs Run with pass returning outs in turn; the pass after the
// last closes stopping. It returns the causes begin saw and the log.
func script(t *testing.T, wake chan struct{}, outs []Outcome, errs []error) ([]Cause, string) {
	t.Helper()
	var logBuf bytes.Buffer
	stopping := make(chan struct{})
	var causes []Cause
	calls := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		cfg := Config{Poll: time.Hour, ErrMin: time.Millisecond, ErrMax: time.Millisecond, Log: slog.New(slog.NewTextHandler(&logBuf, nil))}
		Run(context.Background(), stopping, wake, cfg, func(c Cause) { causes = append(causes, c) },
			func(context.Context) (Outcome, error) {
				i := calls
				calls++
				if i == len(outs)-1 {
					close(stopping)
				}
				return outs[i], errs[i]
			})
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after stopping was closed")
	}
	if calls != len(outs) {
		t.Fatalf("%d passes, want %d", calls, len(outs))
	}
	return causes, logBuf.String()
}

// A wake-up starts a drain that passes while passes come back with More,
// and a failed pass is tried again after a pause, logged.
func TestDrainAndRetryAfterFailure(t *testing.T) {
	wake := make(chan struct{}, 1)
	wake <- struct{}{}
	causes, log := script(t, wake,
		[]Outcome{{More: true}, {}, {More: true}, {}},
		[]error{nil, errors.New("broker down"), nil, nil})
	if !slices.Equal(causes, []Cause{Woken}) {
		t.Fatalf("causes = %v, want one drain started by the wake-up", causes)
	}
	if !strings.Contains(log, "pass failed") || !strings.Contains(log, "broker down") {
		t.Fatalf("log = %q, want the failed pass", log)
	}
}

// A drain whose last pass stopped at a waiting row sets the next drain for
// when the wait ends, not the poll.
func TestWaitingRowSetsTheNextDrain(t *testing.T) {
	wake := make(chan struct{}, 1)
	wake <- struct{}{}
	causes, _ := script(t, wake, []Outcome{{Wait: time.Millisecond}, {}}, []error{nil, nil})
	if !slices.Equal(causes, []Cause{Woken, Retried}) {
		t.Fatalf("causes = %v, want the wake-up's drain, then the retry's", causes)
	}
}

// lingerRun runs Run with Linger linger: the first drain (woken) publishes
// rows1 rows, and wakes the loop again from inside its pass; the second
// drain closes stopping. It returns when each drain began.
func lingerRun(t *testing.T, linger time.Duration, rows1 int) []time.Time {
	t.Helper()
	wake := make(chan struct{}, 1)
	wake <- struct{}{}
	stopping := make(chan struct{})
	var began []time.Time
	done := make(chan struct{})
	go func() {
		defer close(done)
		cfg := Config{Poll: time.Hour, ErrMin: time.Millisecond, ErrMax: time.Millisecond, Log: slog.New(slog.DiscardHandler), Linger: linger}
		Run(context.Background(), stopping, wake, cfg, func(Cause) { began = append(began, time.Now()) },
			func(context.Context) (Outcome, error) {
				if len(began) == 1 {
					wake <- struct{}{} // a commit during the pass
					return Outcome{Rows: rows1}, nil
				}
				close(stopping)
				return Outcome{Rows: 1}, nil
			})
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return")
	}
	if len(began) != 2 {
		t.Fatalf("%d drains, want 2", len(began))
	}
	return began
}

// After a drain of several rows, a wake-up during it starts the next
// drain only Linger after the first began.
func TestBusyDrainLingers(t *testing.T) {
	const linger = 50 * time.Millisecond
	began := lingerRun(t, linger, 5)
	if gap := began[1].Sub(began[0]); gap < linger {
		t.Fatalf("second drain began %v after the first, want at least the linger %v", gap, linger)
	}
}

// After a drain of one row, the next wake-up passes at once, however long
// the linger: a lightly loaded relay adds no delay.
func TestLightDrainDoesNotLinger(t *testing.T) {
	began := lingerRun(t, time.Hour, 1)
	if gap := began[1].Sub(began[0]); gap > 10*time.Second {
		t.Fatalf("second drain began %v after the first: it lingered after a one-row drain", gap)
	}
}

// Stopping while a drain lingers returns at once, without the drain.
func TestStopDuringLinger(t *testing.T) {
	wake := make(chan struct{}, 1)
	wake <- struct{}{}
	stopping := make(chan struct{})
	drains := 0
	sent := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		cfg := Config{Poll: time.Hour, ErrMin: time.Millisecond, ErrMax: time.Millisecond, Log: slog.New(slog.DiscardHandler), Linger: time.Hour}
		Run(context.Background(), stopping, wake, cfg, func(Cause) { drains++ },
			func(context.Context) (Outcome, error) {
				wake <- struct{}{}
				close(sent)
				return Outcome{Rows: 5}, nil
			})
	}()
	// Once the loop has taken the second wake-up it lingers for an hour.
	// Closing stopping must end it.
	<-sent
	testenv.WaitFor(t, 30*time.Second, "the loop took the second wake-up", func() bool { return len(wake) == 0 })
	close(stopping)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return while lingering")
	}
	if drains != 1 {
		t.Fatalf("%d drains, want 1 (the lingering one never began)", drains)
	}
}
