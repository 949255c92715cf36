package perf

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
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

// apiCaller makes the change calls of a change run through one kept-alive
// connection per service.
type apiCaller struct {
	client *http.Client
	token  string
}

// call sends method to u with a JSON body and returns the status and the
// answer (the error is the request's).
func (a apiCaller) call(ctx context.Context, method, u, body string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader([]byte(body)))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, b, err
}

// changeRun runs one run of VariantEdit or VariantRead on chat chatID of e:
// it sets up what the changes need (a message to edit; Messages messages
// to mark read, shown at the reader's client first, not timed), then makes
// Messages changes one per Interval, each keyed by what its frame carries
// (the edit's version, the read mark's upto_seq), and waits up to Settle
// for every frame.
func changeRun(ctx context.Context, e *env.Env, variant string, chatID int64, opts LatencyOptions) (*LatencyRun, error) {
	// The frame to time: edits are shown at the workers' client, read marks
	// (made on workers) at the consumers'.
	watchAt, frameType := e.WorkersURL, "edit"
	if variant == VariantRead {
		watchAt, frameType = e.ConsumersURL, "read"
	}
	var mu sync.Mutex
	arrived := map[int64]time.Time{} // version or upto_seq → first frame
	var delivered int64              // the consumers' receipt at the watcher (read)
	dups := 0
	w, err := probe.NewWatcher(watchAt, chatID, &probe.WatcherConfig{Token: e.Token,
		OnOther: func(typ string, frame []byte, at time.Time) {
			var f struct {
				From    string `json:"from"`
				Version int64  `json:"version"`
				UptoSeq int64  `json:"upto_seq"`
			}
			if json.Unmarshal(frame, &f) != nil {
				return
			}
			if typ == "receipt" && f.From == chat.Consumers {
				mu.Lock()
				delivered = max(delivered, f.UptoSeq)
				mu.Unlock()
			}
			if typ != frameType {
				return
			}
			key := f.Version
			if variant == VariantRead {
				// From is whose messages were read: the consumers'.
				if f.From != chat.Consumers {
					return
				}
				key = f.UptoSeq
			}
			mu.Lock()
			if _, ok := arrived[key]; ok {
				dups++
			} else {
				arrived[key] = at
			}
			mu.Unlock()
		}})
	if err != nil {
		return nil, err
	}
	if err := w.Start(ctx); err != nil {
		return nil, err
	}
	defer w.Stop(context.Background())
	if err := probe.Connect(ctx, w); err != nil {
		return nil, fmt.Errorf("watcher could not connect to %s: %w", watchAt, err)
	}
	waitFor := func(what string, cond func() bool) error {
		wctx, cancel := context.WithTimeout(ctx, opts.Settle)
		defer cancel()
		if err := env.WaitFor(wctx, 5*time.Millisecond, func() bool { mu.Lock(); defer mu.Unlock(); return cond() }); err != nil {
			return fmt.Errorf("%s not shown within %v", what, opts.Settle)
		}
		return nil
	}

	snd, err := probe.NewConnSender(e.ConsumersURL, e.Token, 5*time.Second)
	if err != nil {
		return nil, err
	}
	defer snd.Close()
	api := apiCaller{client: &http.Client{Timeout: 5 * time.Second}, token: e.Token}
	defer api.client.CloseIdleConnections()
	// What each change call is: its URL, body and the key of its frame.
	type change struct {
		u, body string
		key     int64
	}
	changes := make([]change, 0, opts.Messages)
	method := http.MethodPatch
	// before runs ahead of a change's timed call, after behind it
	// (untimed both); nil: nothing.
	var before, after func(change) error
	switch variant {
	case VariantEdit:
		id, err := snd.Send(ctx, chatID, "to be edited")
		if err != nil {
			return nil, fmt.Errorf("send the message to edit: %w", err)
		}
		u := fmt.Sprintf("%s/api/chats/%d/messages/%s", e.ConsumersURL, chatID, id)
		// A warm-up edit (version 2), not timed.
		if err := expect(api.call(ctx, method, u, `{"body":"warm-up"}`)); err != nil {
			return nil, fmt.Errorf("warm-up edit: %w", err)
		}
		if err := waitFor("the warm-up edit", func() bool { _, ok := arrived[2]; return ok }); err != nil {
			return nil, err
		}
		for i := 1; i <= opts.Messages; i++ {
			changes = append(changes, change{u, fmt.Sprintf(`{"body":"edit %d"}`, i), int64(i + 2)})
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
		if err := waitFor("the receipt of the first message", func() bool { return delivered >= 1 }); err != nil {
			return nil, err
		}
		method = http.MethodPost
		u := fmt.Sprintf("%s/api/chats/%d/read", e.WorkersURL, chatID)
		if err := expect(api.call(ctx, method, u, `{"upto_seq":1}`)); err != nil {
			return nil, fmt.Errorf("warm-up read mark: %w", err)
		}
		if err := waitFor("the warm-up read mark", func() bool { _, ok := arrived[1]; return ok }); err != nil {
			return nil, err
		}
		for i := 1; i <= opts.Messages; i++ {
			seq := int64(i + 1)
			changes = append(changes, change{u, fmt.Sprintf(`{"upto_seq":%d}`, seq), seq})
		}
		before = func(c change) error {
			return waitFor(fmt.Sprintf("the receipt of message %d", c.key), func() bool { return delivered >= c.key })
		}
		after = func(c change) error {
			_, err := snd.Send(ctx, chatID, fmt.Sprintf("to be read %d", c.key+1))
			return err
		}
	}

	type made struct {
		key int64
		at  time.Time
	}
	var done []made
	r := &LatencyRun{}
	next := time.Now()
	for _, c := range changes {
		if err := env.SleepUntil(ctx, next); err != nil {
			return nil, err
		}
		if before != nil {
			if err := before(c); err != nil {
				return nil, err
			}
		}
		t0 := time.Now()
		next = t0.Add(opts.Interval)
		err := expect(api.call(ctx, method, c.u, c.body))
		if err == nil {
			done = append(done, made{c.key, t0})
		} else if ctx.Err() != nil {
			return nil, ctx.Err()
		} else {
			r.SendErrors++
		}
		if after != nil {
			if err := after(c); err != nil {
				return nil, fmt.Errorf("send the next message to read: %w", err)
			}
		}
	}
	r.Sent = len(done)
	_ = waitFor("every change", func() bool {
		// Keys grow with each change: the last one's frame shows them all.
		if len(done) == 0 {
			return true
		}
		_, ok := arrived[done[len(done)-1].key]
		return ok
	})
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	mu.Lock()
	for _, d := range done {
		// A change is shown by its own frame or by the first newer one: the
		// gateway may push only the newest of several edits (or read marks)
		// that arrive together, and the page then shows that.
		var at time.Time
		for k, t := range arrived {
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
	r.DuplicatesShown = dups
	mu.Unlock()
	slices.Sort(r.Samples)
	r.P50, r.P95, r.P99 = probe.Percentile(r.Samples, 0.50), probe.Percentile(r.Samples, 0.95), probe.Percentile(r.Samples, 0.99)
	if n := len(r.Samples); n > 0 {
		r.Max = r.Samples[n-1]
	}
	return r, nil
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
