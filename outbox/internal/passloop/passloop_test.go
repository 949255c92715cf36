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
