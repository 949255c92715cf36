package groupcommit

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"
)

// Items that arrive while a run is in flight run together in the next one,
// each exactly once, and a caller whose ctx ends while it waits leaves
// without running and without stalling the others.
func TestQueueCoalescesAndLetsWaitersLeave(t *testing.T) {
	var q Queue[*int]
	var mu sync.Mutex
	var runs [][]int
	first := make(chan struct{})
	release := make(chan struct{})
	run := func(_ context.Context, items []*int) {
		mu.Lock()
		n := len(runs)
		ids := make([]int, len(items))
		for i, it := range items {
			ids[i] = *it
		}
		runs = append(runs, ids)
		mu.Unlock()
		if n == 0 {
			close(first)
			<-release
		}
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	do := func(ctx context.Context, id int) <-chan error {
		done := make(chan error, 1)
		wg.Go(func() { done <- q.Do(ctx, 0, &id, run) })
		return done
	}
	d0 := do(ctx, 0)
	<-first
	gone, cancel := context.WithCancel(ctx)
	dGone := do(gone, 99)
	waitFor(t, &q, 1)
	var ds []<-chan error
	for id := 1; id <= 5; id++ {
		ds = append(ds, do(ctx, id))
		waitFor(t, &q, id+1)
	}
	cancel()
	if err := <-dGone; !errors.Is(err, context.Canceled) {
		t.Fatalf("Do of the caller that left = %v, want context.Canceled", err)
	}
	if n := q.Waiting(); n != 5 {
		t.Fatalf("waiting after one left = %d, want 5", n)
	}
	close(release)
	for _, d := range append(ds, d0) {
		if err := <-d; err != nil {
			t.Fatalf("Do = %v", err)
		}
	}
	wg.Wait()
	if len(runs) != 2 || len(runs[0]) != 1 || len(runs[1]) != 5 {
		t.Fatalf("runs = %v, want [[0] [1 2 3 4 5]]", runs)
	}
	for i, id := range runs[1] {
		if id != i+1 {
			t.Fatalf("second run = %v, want the items in arrival order", runs[1])
		}
	}
	// Idle again: the next item runs at once, alone.
	one := 7
	if err := q.Do(ctx, 0, &one, run); err != nil || len(runs) != 3 || len(runs[2]) != 1 {
		t.Fatalf("Do on an idle queue = %v, runs %v", err, runs)
	}
}

// waitFor spins until n items wait (the callers' goroutines are about to
// block; no timed sleep), for at most 10 s.
func waitFor(t *testing.T, q *Queue[*int], n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for q.Waiting() != n {
		if time.Now().After(deadline) {
			t.Fatalf("waiting = %d, want %d", q.Waiting(), n)
		}
		runtime.Gosched()
	}
}
