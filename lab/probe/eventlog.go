package probe

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/lab/env"
	"github.com/outboxchat/outboxchat/lab/process"
)

// EventLog prints one line per event in the write-up's form
// ("%5.1fs  %-10s %s": elapsed seconds since Start, actor, event). Safe for
// concurrent use.
type EventLog struct {
	mu sync.Mutex
	w  io.Writer
	t0 time.Time
}

// NewEventLog returns an EventLog writing to w (nil discards).
func NewEventLog(w io.Writer) *EventLog {
	if w == nil {
		w = io.Discard
	}
	return &EventLog{w: w}
}

// Start sets the time events are counted from (elapsed 0.0 s).
func (l *EventLog) Start() {
	l.mu.Lock()
	l.t0 = time.Now()
	l.mu.Unlock()
}

// At logs an event that happened at time t.
func (l *EventLog) At(t time.Time, actor, format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	el := 0.0
	if !l.t0.IsZero() {
		el = t.Sub(l.t0).Seconds()
	}
	fmt.Fprintf(l.w, "%5.1fs  %-10s %s\n", el, actor+":", fmt.Sprintf(format, args...))
}

// Add logs an event that happens now.
func (l *EventLog) Add(actor, format string, args ...any) {
	l.At(time.Now(), actor, format, args...)
}

// Events runs event-producing callbacks (which may query the database) off
// the log-reader and watcher goroutines, in order, on one goroutine it owns
// until Close. Safe for concurrent use.
type Events struct {
	mu     sync.Mutex
	closed bool
	ch     chan func()
	done   chan struct{}
}

// NewEvents starts the goroutine of an Events.
func NewEvents() *Events {
	a := &Events{ch: make(chan func(), 4096), done: make(chan struct{})}
	go func() {
		defer close(a.done)
		for f := range a.ch {
			f()
		}
	}()
	return a
}

// Do queues f; when thousands are queued already it drops f rather than
// block the caller (a log reader). After Close it does nothing.
func (a *Events) Do(f func()) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return
	}
	select {
	case a.ch <- f:
	default: // a flood of events: drop rather than block a reader
	}
}

// Close runs what is queued and ends the goroutine. Idempotent.
func (a *Events) Close() {
	a.mu.Lock()
	if !a.closed {
		a.closed = true
		close(a.ch)
	}
	a.mu.Unlock()
	<-a.done
}

// LogFrames returns a WatcherConfig.OnFrame that logs each frame of a
// consumers' message as the workers' event: "msg N shown", "msg N shown
// AGAIN (shown twice)" and, with order, "msg N shown OUT OF ORDER".
func LogFrames(log *EventLog, order bool) func(Shown) {
	return func(f Shown) {
		if f.Message.From != chat.Consumers {
			return
		}
		switch {
		case f.Duplicate:
			log.At(f.At, "workers", "%s shown AGAIN (shown twice)", f.Message.Body)
		case order && f.OutOfOrder:
			log.At(f.At, "workers", "%s shown OUT OF ORDER", f.Message.Body)
		default:
			log.At(f.At, "workers", "%s shown", f.Message.Body)
		}
	}
}

// LogDuplicate logs l when it is the workers' inbox.EventDuplicate line
// ("msg N again, already in inbox, skipped"; the label is read from e's
// database on events' goroutine, off the log reader's) and reports whether
// it was.
func LogDuplicate(ctx context.Context, e *env.Env, log *EventLog, events *Events, l process.LogLine) bool {
	if l.Event() != string(inbox.EventDuplicate) {
		return false
	}
	id := l.Str("message_id")
	events.Do(func() { log.At(l.Time, "workers", "%s again, already in inbox, skipped", Label(ctx, e, id)) })
	return true
}

// ConnectTimeout bounds Connect.
const ConnectTimeout = 10 * time.Second

// Connect waits up to ConnectTimeout for w's first connection.
func Connect(ctx context.Context, w *Watcher) error {
	ctx, cancel := context.WithTimeout(ctx, ConnectTimeout)
	defer cancel()
	return w.WaitConnected(ctx)
}
