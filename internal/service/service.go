// Package service is the one start/stop contract of every long-running part
// of outboxchat: the outbox Relay and Writer, the inbox Consumer, the chat
// Store's group committer, the chat Gateway, the notifier, and whatever
// background loop comes next. It is modelled on River's
// rivershared/startstop (riverqueue/river), extended with the graceful drain
// our Stop needs.
//
// The contract, for every type that embeds or holds a Lifecycle:
//
//   - Start(ctx) does not block: it launches the service's goroutines and
//     returns. It returns an error wrapping ErrAlreadyStarted while a run is
//     in progress (started and not yet fully stopped), or ctx.Err() if ctx is
//     already done.
//   - Cancelling Start's ctx is a hard stop: the run's context (Run.Context)
//     is cancelled, in-flight work is abandoned, every goroutine returns.
//   - Stop(ctx) asks for a graceful stop (Run.Stopping is closed: take no new
//     work, finish what is in flight), waits for every goroutine, then
//     cancels the run's context. If ctx ends first, Stop cancels the run's
//     context (a hard stop), still waits for the goroutines to return, and
//     returns ctx.Err(). Stop is idempotent and returns nil when nothing
//     runs; a Start after any Stop starts a new run.
//   - Started() and Stopped() are channels closed when the latest run has
//     started and when it has fully stopped (every goroutine returned).
//
// Goroutines a run owns are started with Run.Go; each must return promptly
// once Run.Context is done, which is what bounds Stop.
package service

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrAlreadyStarted is wrapped by Start while a run is in progress: started
// and not yet fully stopped. outbox.ErrAlreadyStarted and inbox.ErrStarted
// are this value.
var ErrAlreadyStarted = errors.New("already started")

// Service is what every long-running part of outboxchat implements (see the
// package doc for the contract). chat.Serve starts a list of them in order
// and stops them in reverse.
type Service interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
}

// Lifecycle implements the contract's bookkeeping for a service: hold it
// and call its Start with a launch function that starts the service's
// goroutines through Run.Go; Stop, Started and Stopped serve as the
// service's own. The zero value is ready to use. All methods are safe for
// concurrent use.
type Lifecycle struct {
	// Name prefixes the errors of Start and Stop ("<Name>: start: ...",
	// "<Name>: stop: ..."), e.g. "outbox: relay". Default "": no prefix.
	// Set it before the first Start.
	Name string

	mu      sync.Mutex
	run     *Run          // latest run; nil before the first Start
	started chan struct{} // the next (or latest) run's Started channel
}

// Run is one Start..stopped span of a service. The launch function given to
// Lifecycle.Start receives it; the goroutines it starts keep it.
type Run struct {
	ctx      context.Context
	cancel   context.CancelFunc
	stopping chan struct{}
	stopOnce sync.Once
	drainCtx context.Context
	wg       sync.WaitGroup
	stopped  chan struct{}
}

// Context is the run's context: cancelled on a hard stop (Start's ctx ended,
// or Stop's ctx ended before the goroutines returned) and after a graceful
// stop completed. Work in flight uses it.
func (r *Run) Context() context.Context { return r.ctx }

// Stopping is closed when Stop is called (or on a hard stop, when Context is
// done too): take no new work, finish what is in flight.
func (r *Run) Stopping() <-chan struct{} { return r.stopping }

// DrainContext is cancelled when Stopping is closed or Context is done: for
// the blocking calls that wait for new work (a fetch, a LISTEN wait), which
// a graceful stop interrupts.
func (r *Run) DrainContext() context.Context { return r.drainCtx }

// Go starts f as one of the run's goroutines; the run has stopped when every
// such f has returned. Call it from the launch function given to Start or
// from a goroutine the run already owns (never after the run has stopped).
func (r *Run) Go(f func()) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		f()
	}()
}

// Every starts one of the run's goroutines (see Go): it calls fn after the
// delay first, then again after each delay fn returns, until the run is
// stopping. A call in flight is never interrupted by a graceful stop; fn
// gets the run's Context, which a hard stop cancels. For the periodic loops
// (re-drive, pruning, heartbeats): the time between calls is measured from
// the end of one to the start of the next, so a slow call is not followed
// by a burst. Call it where Go may be called.
func (r *Run) Every(first time.Duration, fn func(ctx context.Context) (next time.Duration)) {
	r.Go(func() {
		t := time.NewTimer(first)
		defer t.Stop()
		for {
			select {
			case <-r.stopping:
				return
			case <-t.C:
			}
			t.Reset(fn(r.ctx))
		}
	})
}

// Start begins a run: it derives the run's context from ctx, calls launch
// (which starts the goroutines with Run.Go and must not block), closes the
// Started channel and returns. Errors, wrapped with Name: ctx.Err() if ctx
// is done, or ErrAlreadyStarted while the previous run has not fully
// stopped. launch is called with the Lifecycle's lock held, so it must not
// call the Lifecycle's methods.
func (l *Lifecycle) Start(ctx context.Context, launch func(*Run)) error {
	if err := ctx.Err(); err != nil {
		return l.wrap("start", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.run != nil {
		select {
		case <-l.run.stopped:
		default:
			return l.wrap("start", ErrAlreadyStarted)
		}
	}
	runCtx, cancel := context.WithCancel(ctx)
	r := &Run{ctx: runCtx, cancel: cancel, stopping: make(chan struct{}), stopped: make(chan struct{})}
	drain, cancelDrain := context.WithCancel(runCtx)
	r.drainCtx = drain
	stopDrain := context.AfterFunc(runCtx, func() { r.stopOnce.Do(func() { close(r.stopping) }) })
	// The run's own goroutine turns a hard stop into Stopping too, and keeps
	// the run alive until one of them: a launch that starts nothing is a
	// run all the same.
	r.Go(func() {
		select {
		case <-r.stopping:
		case <-runCtx.Done():
		}
		cancelDrain()
	})
	launch(r)
	l.run = r
	if l.started == nil || isClosed(l.started) {
		l.started = make(chan struct{})
	}
	close(l.started)
	go func() {
		r.wg.Wait()
		stopDrain()
		cancel()
		close(r.stopped)
	}()
	return nil
}

// Stop stops the latest run gracefully: it closes Stopping, waits for every
// goroutine of the run to return, then cancels the run's context. If ctx
// ends first it cancels the run's context (hard stop), waits for the
// goroutines all the same and returns ctx.Err() wrapped with Name.
// Idempotent: nil when no run is in progress. Concurrent Stops all wait.
func (l *Lifecycle) Stop(ctx context.Context) error {
	l.mu.Lock()
	r := l.run
	l.mu.Unlock()
	if r == nil {
		return nil
	}
	select {
	case <-r.stopped:
		return nil
	default:
	}
	r.stopOnce.Do(func() { close(r.stopping) })
	select {
	case <-r.stopped:
		return nil
	case <-ctx.Done():
	}
	r.cancel()
	<-r.stopped
	return l.wrap("stop", ctx.Err())
}

func (l *Lifecycle) wrap(op string, err error) error {
	if l.Name == "" {
		return fmt.Errorf("%s: %w", op, err)
	}
	return fmt.Errorf("%s: %s: %w", l.Name, op, err)
}

// Started returns a channel closed once the latest run has started: after
// Start returned nil. Before the first Start it returns the channel the
// first Start will close.
func (l *Lifecycle) Started() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.run != nil {
		select {
		case <-l.run.stopped:
			// The latest run is over: a new Start closes a new channel.
			if isClosed(l.started) {
				l.started = make(chan struct{})
			}
		default:
		}
	}
	if l.started == nil {
		l.started = make(chan struct{})
	}
	return l.started
}

// Stopped returns a channel closed once the latest run has fully stopped
// (every goroutine returned, by Stop or by a hard stop); closed already when
// the service was never started.
func (l *Lifecycle) Stopped() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.run == nil {
		return closedChan
	}
	return l.run.stopped
}

// Running reports whether a run is in progress (started, not fully stopped).
func (l *Lifecycle) Running() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.run != nil && !isClosed(l.run.stopped)
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
