package inbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/inbox"
)

// scriptedSource fails the Fetches its script says to ("fail"), and
// passes the others ("real", and every Fetch past the script) to a real
// redisq source.
type scriptedSource struct {
	real   inbox.Source
	mu     sync.Mutex
	script []string
	empty  int // real fetches that returned nothing
}

func (s *scriptedSource) Ack(ctx context.Context, refs ...string) error {
	return s.real.Ack(ctx, refs...)
}

func (s *scriptedSource) DeadLetter(ctx context.Context, d inbox.Delivery, reason string) error {
	return s.real.DeadLetter(ctx, d, reason)
}

var errFetch = errors.New("scripted fetch failure")

func (s *scriptedSource) Fetch(ctx context.Context, max int) ([]inbox.Delivery, error) {
	s.mu.Lock()
	step := "real"
	if len(s.script) > 0 {
		step, s.script = s.script[0], s.script[1:]
	}
	s.mu.Unlock()
	if step == "fail" {
		return nil, errFetch
	}
	ds, err := s.real.Fetch(ctx, max)
	if err == nil && len(ds) == 0 {
		s.mu.Lock()
		s.empty++
		s.mu.Unlock()
	}
	return ds, err
}

// An idle consumer's fetch errors of two incidents, separated by a fetch
// that worked and found nothing: the second incident starts again at
// RetryBackoff with a failure count of 1 (carrying on from the first
// incident's count would wait MaxRetryBackoff at its first error).
func TestFetchBackoffResetsAfterEmptyFetch(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	src := &scriptedSource{real: e.source(t, "c1"), script: []string{"fail", "fail", "fail", "fail", "real", "fail"}}
	c := e.consumer(t, src, inbox.HandlerFunc(applyInbox), &inbox.Config{
		RetryBackoff: 10 * time.Millisecond, MaxRetryBackoff: time.Second,
	})
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	var recs []map[string]any
	for {
		recs = e.logs.records(t, "fetch failed")
		if len(recs) >= 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d fetch failures logged within 30 s, want 5", len(recs))
		}
		time.Sleep(5 * time.Millisecond)
	}
	src.mu.Lock()
	empty := src.empty
	src.mu.Unlock()
	if empty < 1 {
		t.Fatalf("no empty fetch between the incidents")
	}
	want := []struct {
		failures float64
		retryIn  time.Duration
	}{{1, 10 * time.Millisecond}, {2, 20 * time.Millisecond}, {3, 40 * time.Millisecond}, {4, 80 * time.Millisecond},
		{1, 10 * time.Millisecond}} // after the empty fetch: reset
	for i, w := range want {
		got, gotWait := recs[i]["failures"], time.Duration(recs[i]["retry_in"].(float64))
		if got != w.failures || gotWait != w.retryIn {
			t.Errorf("fetch failure %d: failures=%v retry_in=%v, want %v and %v", i+1, got, gotWait, w.failures, w.retryIn)
		}
	}
}
