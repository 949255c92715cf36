package latency

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/lab/env"
	"github.com/outboxchat/outboxchat/lab/probe"
)

// Change variants of `lab latency`: they run on v2's environment (outbox,
// wake-up after commit) and time another kind of change than a new
// message, with the same pacing (one call per Interval, not waiting for
// the previous one to show) and the same clock (the call's start to the
// frame's arrival at the other service's WebSocket client).
const (
	// VariantEdit: the consumers' author edits one message of theirs
	// again and again (PATCH); each edit's "edit" frame, by its version
	// (or the first frame of a newer version), at the workers' client.
	VariantEdit = "edit"
	// VariantRead: a workers reader marks the consumers' messages read one
	// seq further each time (POST …/read); each read mark's "read" frame,
	// by its upto_seq (or the first one further), at the consumers' client.
	VariantRead = "read"
)

// isChangeVariant reports whether v is VariantEdit or VariantRead.
func isChangeVariant(v string) bool { return v == VariantEdit || v == VariantRead }

// checkLatencyVariant returns an error naming v unless `lab latency` can
// measure it.
func checkLatencyVariant(v string) error {
	if isChangeVariant(v) {
		return nil
	}
	if err := env.CheckVariant(v); err != nil {
		return fmt.Errorf("%w (or %s, %s: an edit, a read mark)", err, VariantEdit, VariantRead)
	}
	return nil
}

// envVariant is the environment variant a latency variant runs on.
func envVariant(v string) string {
	if isChangeVariant(v) {
		return env.VariantV2
	}
	return v
}

// changeFrames is what a change run's watcher has seen: the first arrival
// of each change frame by its key (an edit's version, a read mark's
// upto_seq), how many frames repeated a key, and the newest receipt of the
// consumers' messages. Its methods are safe for concurrent use.
type changeFrames struct {
	mu        sync.Mutex
	arrived   map[int64]time.Time
	dups      int
	delivered int64
}

// onFrame records frame, of type typ and read at at, if it is a frame of
// frameType that variant times (or a receipt of the consumers' messages).
func (f *changeFrames) onFrame(variant, frameType, typ string, frame []byte, at time.Time) {
	var fr struct {
		From    string `json:"from"`
		Version int64  `json:"version"`
		UptoSeq int64  `json:"upto_seq"`
	}
	if json.Unmarshal(frame, &fr) != nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if typ == "receipt" && fr.From == chat.Consumers {
		f.delivered = max(f.delivered, fr.UptoSeq)
	}
	if typ != frameType {
		return
	}
	key := fr.Version
	if variant == VariantRead {
		// From is whose messages were read: the consumers'.
		if fr.From != chat.Consumers {
			return
		}
		key = fr.UptoSeq
	}
	if _, ok := f.arrived[key]; ok {
		f.dups++
	} else {
		f.arrived[key] = at
	}
}

// shown reports whether the frame of key has arrived.
func (f *changeFrames) shown(key int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.arrived[key]
	return ok
}

// deliveredUpTo reports whether the consumers' messages up to seq are
// received at the watcher.
func (f *changeFrames) deliveredUpTo(seq int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.delivered >= seq
}

// madeChange is a change call that succeeded: its frame's key and the
// call's start.
type madeChange struct {
	key int64
	at  time.Time
}

// result turns the frames seen for done into a run's figures (samples
// sorted, percentiles, lost changes, repeated frames).
func (f *changeFrames) result(done []madeChange, sendErrors int) *Run {
	r := &Run{Sent: len(done), SendErrors: sendErrors}
	f.mu.Lock()
	for _, d := range done {
		// A change is shown by its own frame or by the first newer one: the
		// gateway may push only the newest of several edits (or read marks)
		// that arrive together, and the page then shows that.
		var at time.Time
		for k, t := range f.arrived {
			if k >= d.key && (at.IsZero() || t.Before(at)) {
				at = t
			}
		}
		if at.IsZero() {
			r.Lost++
			continue
		}
		r.Samples = append(r.Samples, at.Sub(d.at))
	}
	r.DuplicatesShown = f.dups
	f.mu.Unlock()
	r.summarize()
	return r
}

// change is one change call of a run: its URL, body and the key of its
// frame.
type change struct {
	u    string
	body []byte
	key  int64
}

// changePlan is a run's change calls, made with method; before runs ahead
// of a change's timed call, after behind it (untimed both); nil: nothing.
type changePlan struct {
	method        string
	changes       []change
	before, after func(change) error
}

// planChanges sets up what variant's changes need on chat chatID (a
// message to edit; messages to mark read, shown at the reader's client
// first) with an untimed warm-up change, and returns the opts.Messages
// timed changes. waitFor waits up to Settle for cond.
func planChanges(ctx context.Context, e *env.Env, variant string, chatID int64, opts Options,
	snd *probe.ConnSender, api *probe.Sender, frames *changeFrames, waitFor func(what string, cond func() bool) error) (*changePlan, error) {
	p := &changePlan{method: http.MethodPatch, changes: make([]change, 0, opts.Messages)}
	switch variant {
	case VariantEdit:
		id, err := snd.Send(ctx, chatID, "to be edited")
		if err != nil {
			return nil, fmt.Errorf("send the message to edit: %w", err)
		}
		u := fmt.Sprintf("%s/api/chats/%d/messages/%s", e.ConsumersURL, chatID, id)
		// A warm-up edit (version 2), not timed.
		if err := expect(api.Do(ctx, p.method, u, []byte(`{"body":"warm-up"}`), "")); err != nil {
			return nil, fmt.Errorf("warm-up edit: %w", err)
		}
		if err := waitFor("the warm-up edit", func() bool { return frames.shown(2) }); err != nil {
			return nil, err
		}
		for i := 1; i <= opts.Messages; i++ {
			p.changes = append(p.changes, change{u, fmt.Appendf(nil, `{"body":"edit %d"}`, i), int64(i + 2)})
		}
	case VariantRead:
		// A read mark moves up to the reader's newest received message
		// only, so each one needs a message of its own: the message a
		// mark reads is sent one interval before it (after the previous
		// mark, untimed) and is in the workers' inbox (its ✓✓ receipt at
		// the consumers' client) before the mark's call starts. The
		// message sends are as paced as the marks, and go to the other
		// service's API: neither meets the per-user rate limit.
		for i := 1; i <= 2; i++ {
			if _, err := snd.Send(ctx, chatID, fmt.Sprintf("to be read %d", i)); err != nil {
				return nil, fmt.Errorf("send the messages to read: %w", err)
			}
		}
		if err := waitFor("the receipt of the first message", func() bool { return frames.deliveredUpTo(1) }); err != nil {
			return nil, err
		}
		p.method = http.MethodPost
		u := fmt.Sprintf("%s/api/chats/%d/read", e.WorkersURL, chatID)
		if err := expect(api.Do(ctx, p.method, u, []byte(`{"upto_seq":1}`), "")); err != nil {
			return nil, fmt.Errorf("warm-up read mark: %w", err)
		}
		if err := waitFor("the warm-up read mark", func() bool { return frames.shown(1) }); err != nil {
			return nil, err
		}
		for i := 1; i <= opts.Messages; i++ {
			seq := int64(i + 1)
			p.changes = append(p.changes, change{u, fmt.Appendf(nil, `{"upto_seq":%d}`, seq), seq})
		}
		p.before = func(c change) error {
			return waitFor(fmt.Sprintf("the receipt of message %d", c.key), func() bool { return frames.deliveredUpTo(c.key) })
		}
		p.after = func(c change) error {
			_, err := snd.Send(ctx, chatID, fmt.Sprintf("to be read %d", c.key+1))
			return err
		}
	}
	return p, nil
}

// changeRun runs one run of VariantEdit or VariantRead on chat chatID of e:
// it sets up what the changes need (planChanges), then makes Messages
// changes one per Interval, each keyed by what its frame carries (the
// edit's version, the read mark's upto_seq), and waits up to Settle for
// every frame.
func changeRun(ctx context.Context, e *env.Env, variant string, chatID int64, opts Options) (*Run, error) {
	// The frame to time: edits are shown at the workers' client, read marks
	// (made on workers) at the consumers'.
	watchAt, frameType := e.WorkersURL, "edit"
	if variant == VariantRead {
		watchAt, frameType = e.ConsumersURL, "read"
	}
	frames := &changeFrames{arrived: map[int64]time.Time{}}
	w, err := watch(ctx, watchAt, chatID, &probe.WatcherConfig{Token: e.Token,
		OnOther: func(typ string, frame []byte, at time.Time) {
			frames.onFrame(variant, frameType, typ, frame, at)
		}})
	if err != nil {
		return nil, err
	}
	defer w.Stop(context.Background())
	waitFor := func(what string, cond func() bool) error {
		wctx, cancel := context.WithTimeout(ctx, opts.Settle)
		defer cancel()
		if err := env.WaitFor(wctx, 5*time.Millisecond, cond); err != nil {
			return fmt.Errorf("%s not shown within %v", what, opts.Settle)
		}
		return nil
	}

	snd, err := probe.NewConnSender(e.ConsumersURL, e.Token, 5*time.Second)
	if err != nil {
		return nil, err
	}
	defer snd.Close()
	// The change calls go through one kept-alive connection per service.
	api := probe.NewSender(e.Token)
	defer api.CloseIdle()
	plan, err := planChanges(ctx, e, variant, chatID, opts, snd, api, frames, waitFor)
	if err != nil {
		return nil, err
	}

	var done []madeChange
	sendErrors := 0
	next := time.Now()
	for _, c := range plan.changes {
		if err := env.SleepUntil(ctx, next); err != nil {
			return nil, err
		}
		if plan.before != nil {
			if err := plan.before(c); err != nil {
				return nil, err
			}
		}
		t0 := time.Now()
		next = t0.Add(opts.Interval)
		err := expect(api.Do(ctx, plan.method, c.u, c.body, ""))
		if err == nil {
			done = append(done, madeChange{c.key, t0})
		} else if ctx.Err() != nil {
			return nil, ctx.Err()
		} else {
			sendErrors++
		}
		if plan.after != nil {
			if err := plan.after(c); err != nil {
				return nil, fmt.Errorf("send the next message to read: %w", err)
			}
		}
	}
	// Keys grow with each change: the last one's frame shows them all.
	_ = waitFor("every change", func() bool { return len(done) == 0 || frames.shown(done[len(done)-1].key) })
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return frames.result(done, sendErrors), nil
}

// expect turns a change call's answer into an error unless it is 200.
func expect(code int, body []byte, err error) error {
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("status %d: %s", code, bytes.TrimSpace(body))
	}
	return nil
}
