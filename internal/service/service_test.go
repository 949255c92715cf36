package service_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/outboxchat/outboxchat/internal/service"
	"github.com/outboxchat/outboxchat/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// worker is a minimal service on a Lifecycle: one loop that counts its
// passes until Stopping, and an in-flight job that a test can hold.
type worker struct {
	service.Lifecycle
	loops   atomic.Int32 // loop goroutines currently running
	hold    chan struct{}
	entered chan struct{}
	aborted atomic.Bool // the job saw a hard stop
}

func newWorker() *worker {
	return &worker{hold: make(chan struct{}), entered: make(chan struct{}, 1)}
}

func (w *worker) Start(ctx context.Context) error {
	return w.Lifecycle.Start(ctx, func(r *service.Run) {
		r.Go(func() {
			w.loops.Add(1)
			defer w.loops.Add(-1)
			<-r.Stopping() // no new work after this
			// Drain: the in-flight job finishes unless the run is cancelled.
			select {
			case w.entered <- struct{}{}:
			default:
			}
			select {
			case <-w.hold:
			case <-r.Context().Done():
				w.aborted.Store(true)
			}
		})
	})
}

func (w *worker) Stop(ctx context.Context) error { return w.Lifecycle.Stop(ctx) }

var _ service.Service = (*worker)(nil)

const wait = 10 * time.Second

func closedWithin(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(wait):
		t.Fatalf("%s: not closed within %v", what, wait)
	}
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func TestDoubleStart(t *testing.T) {
	w := newWorker()
	started := w.Started()
	if isClosed(started) {
		t.Fatal("Started closed before Start")
	}
	if !isClosed(w.Stopped()) {
		t.Fatal("Stopped open before the first Start")
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	closedWithin(t, started, "Started (taken before Start)")
	if err := w.Start(context.Background()); !errors.Is(err, service.ErrAlreadyStarted) {
		t.Fatalf("second Start = %v, want ErrAlreadyStarted", err)
	}
	if n := w.loops.Load(); n > 1 {
		t.Fatalf("%d loops after a double Start, want 1", n)
	}
	if !w.Running() || isClosed(w.Stopped()) {
		t.Fatal("not running after Start")
	}
	close(w.hold)
	if err := w.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := w.Stop(context.Background()); err != nil {
		t.Fatalf("second Stop = %v", err)
	}
	if w.Running() || !isClosed(w.Stopped()) || w.loops.Load() != 0 {
		t.Fatal("still running after Stop")
	}
	if w.aborted.Load() {
		t.Fatal("graceful Stop cancelled the in-flight job")
	}
}

func TestStopAfterTimedOutStop(t *testing.T) {
	w := newWorker()
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	// The job never gets released: Stop's deadline passes, it cancels the
	// run, and still returns only after the goroutine did.
	if err := w.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop past its deadline = %v, want DeadlineExceeded", err)
	}
	if !w.aborted.Load() || w.loops.Load() != 0 || !isClosed(w.Stopped()) {
		t.Fatalf("after a timed-out Stop: aborted %v, loops %d", w.aborted.Load(), w.loops.Load())
	}
	if err := w.Stop(context.Background()); err != nil {
		t.Fatalf("Stop after a timed-out Stop = %v, want nil", err)
	}
	// A new run: exactly one loop, and a fresh Started channel.
	w.aborted.Store(false)
	if isClosed(w.Started()) {
		t.Fatal("Started still closed after the run ended")
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	closedWithin(t, w.Started(), "Started of the second run")
	testenv.WaitFor(t, wait, "one loop in the second run", func() bool { return w.loops.Load() == 1 })
	close(w.hold)
	if err := w.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if w.aborted.Load() {
		t.Fatal("second run's graceful Stop cancelled its job")
	}
}

func TestCancelledStartCtxIsHardStop(t *testing.T) {
	w := newWorker()
	ctx, cancel := context.WithCancel(context.Background())
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	closedWithin(t, w.Stopped(), "Stopped after the Start ctx was cancelled")
	if !w.aborted.Load() {
		t.Fatal("the in-flight job was not cancelled by the hard stop")
	}
	if w.Running() {
		t.Fatal("Running after a hard stop")
	}
	if err := w.Stop(context.Background()); err != nil {
		t.Fatalf("Stop after a hard stop = %v, want nil", err)
	}
	// Start again, without a Stop in between being needed.
	if err := w.Start(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Start with a done ctx = %v, want Canceled", err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatalf("Start after a hard stop = %v", err)
	}
	close(w.hold)
	if err := w.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestRunContexts(t *testing.T) {
	var l service.Lifecycle
	var run *service.Run
	if err := l.Start(context.Background(), func(r *service.Run) { run = r }); err != nil {
		t.Fatal(err)
	}
	// A launch that starts nothing still runs until stopped.
	if !l.Running() || run.DrainContext().Err() != nil || run.Context().Err() != nil {
		t.Fatal("launch without goroutines: not running")
	}
	stopped := make(chan error, 1)
	go func() { stopped <- l.Stop(context.Background()) }()
	closedWithin(t, run.Stopping(), "Stopping")
	closedWithin(t, run.DrainContext().Done(), "DrainContext")
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	closedWithin(t, run.Context().Done(), "Context after the graceful stop")
}

func TestConcurrentStartStop(t *testing.T) {
	w := newWorker()
	close(w.hold)
	done := make(chan struct{})
	for range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for range 50 {
				_ = w.Start(context.Background())
				if n := w.loops.Load(); n > 1 {
					t.Errorf("%d loops at once", n)
				}
				_ = w.Stop(context.Background())
			}
		}()
	}
	for range 4 {
		<-done
	}
	if err := w.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if w.loops.Load() != 0 {
		t.Fatalf("%d loops left", w.loops.Load())
	}
}

// Every calls fn after the first delay, then after each delay fn returns;
// a graceful Stop lets the call in flight finish and makes no further call.
func TestEvery(t *testing.T) {
	var l service.Lifecycle
	calls := make(chan int, 10)
	inFlight := make(chan struct{})
	release := make(chan struct{})
	var n atomic.Int32
	err := l.Start(context.Background(), func(r *service.Run) {
		r.Every(0, func(ctx context.Context) time.Duration {
			c := int(n.Add(1))
			calls <- c
			if c == 3 {
				close(inFlight)
				<-release // a call in flight when Stop begins
			}
			return time.Millisecond
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	for want := 1; want <= 3; want++ {
		select {
		case got := <-calls:
			if got != want {
				t.Fatalf("call %d, want %d", got, want)
			}
		case <-time.After(wait):
			t.Fatalf("call %d did not come within %v", want, wait)
		}
	}
	closedWithin(t, inFlight, "third call")
	stopped := make(chan error, 1)
	go func() { stopped <- l.Stop(context.Background()) }()
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned (%v) while a call was in flight", err)
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if got := n.Load(); got != 3 {
		t.Fatalf("%d calls after Stop, want 3 (no call after the graceful stop)", got)
	}
}
