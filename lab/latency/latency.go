package latency

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/lab/env"
	"github.com/outboxchat/outboxchat/lab/probe"
)

// Latency defaults (the write-up's experiment).
const (
	// DefaultMessages is how many messages one run sends.
	DefaultMessages = 100
	// DefaultInterval is the pause between two sends of a run.
	DefaultInterval = 100 * time.Millisecond
	// DefaultRuns is how many runs each variant gets.
	DefaultRuns = 3
	// DefaultSettle bounds the wait, after a run's last send, for
	// every sent message to be shown; what is not shown by then is lost.
	DefaultSettle = 10 * time.Second
	// DefaultFloorSamples is how many round trips each floor measures.
	DefaultFloorSamples = 200
	// PacedFloorSamples is how many round trips each floor measures at the
	// test's pace (one per Interval of idleness).
	PacedFloorSamples = 30
)

// DefaultVariants are the variants `lab latency` measures by
// default, in table order: the write-up's three plus the write-up's own v2
// mode (NOTIFY inside the send transaction).
var DefaultVariants = []string{env.VariantV1, env.VariantV2, env.VariantV2InTx, env.VariantV2Poll}

// variantLabel is a variant's name in the table and the plot.
func variantLabel(v string) string {
	switch v {
	case env.VariantV1:
		return "v1: plain queue add"
	case env.VariantV2:
		return "v2: outbox, wake-up after commit"
	case env.VariantV2InTx:
		return "v2-intx: outbox, NOTIFY in send tx"
	case env.VariantV2Poll:
		return "v2-poll: polling only, 1 s"
	case VariantEdit:
		return "edit: v2, an edit → its edit frame"
	case VariantRead:
		return "read: v2, a read mark → its read frame"
	}
	return v
}

// Options configures Measure. A zero field means its default.
type Options struct {
	// Variants to measure, in order. Default DefaultVariants.
	Variants []string
	// Messages per run. Default DefaultMessages (100).
	Messages int
	// Interval between two sends. Default DefaultInterval (100 ms).
	Interval time.Duration
	// Runs per variant. Default DefaultRuns (3).
	Runs int
	// Settle bounds the wait after a run's last send. Default
	// DefaultSettle (10 s).
	Settle time.Duration
	// FloorSamples is the number of round trips per floor. Default
	// DefaultFloorSamples (200); negative skips the floors.
	FloorSamples int
	// Progress receives progress lines. nil discards them.
	Progress io.Writer
	// Durable runs the servers flushing every commit (env.Options.Durable:
	// Postgres fsync=on); default false, the fast mode (fsync=off).
	Durable bool
	// Instances is the number of API+worker processes per service
	// (env.Options.APIs). Default 1. With more, a run's sends go to the
	// consumers' instances in turn and its watcher is on the last workers
	// instance, so that a message is stored by whichever workers instance
	// read it and shown by the watcher's: the gateway of one instance is
	// woken by another's inbox commit as often as by its own.
	Instances int
}

// Run is one run of one variant.
type Run struct {
	// Samples holds one latency per message shown (send call start →
	// frame at the workers' WebSocket client), sorted ascending.
	Samples []time.Duration
	// Sent is the number of sends answered 201; SendErrors the others.
	Sent, SendErrors int
	// Lost is the number of messages answered 201 but not shown within
	// the settle time.
	Lost int
	// DuplicatesShown is the number of frames that showed a message again.
	DuplicatesShown int
	// P50, P95, P99 and Max summarise Samples (nearest rank; 0 when empty).
	P50, P95, P99, Max time.Duration
	// Stages are the p50s of the three legs of a message's way, split at
	// the timestamps the frame carries (both set by Postgres now(), the
	// start of the transaction): send call start → sent_at (send tx begins),
	// sent_at → received_at (send commit, wake-up, relay, Redis, worker
	// picks the job up and begins its inbox tx), received_at → frame at the
	// client (inbox commit, NOTIFY, gateway read, WebSocket write).
	Stages probe.Stages
}

// orDefault sets *v to d when *v is zero or negative.
func orDefault[T int | time.Duration](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}

// VariantResult is every run of one variant.
type VariantResult struct {
	Variant string
	Runs    []Run
}

// Report is the result of Measure.
type Report struct {
	// Messages, Interval and Runs are the options the report was made with.
	Messages int
	Interval time.Duration
	Runs     int
	// Variants holds one entry per variant, in the order asked.
	Variants []VariantResult
	// Floors are measured on the environment of v2 (or of the first
	// variant when v2 is not measured); nil when skipped.
	Floors *Floors
	// Durable echoes Options.Durable (fsync=on; false: the fast
	// mode, fsync=off).
	Durable bool
	// Instances echoes Options.Instances (1 or more).
	Instances int
}

// Summary is one variant's line of `lab latency --json` (DESIGN.md):
// each figure is the median over runs, in milliseconds; N is the number of
// latency samples (messages shown) over all runs.
type Summary struct {
	Variant string  `json:"variant"`
	Runs    int     `json:"runs"`
	P50Ms   float64 `json:"p50_ms"`
	P95Ms   float64 `json:"p95_ms"`
	P99Ms   float64 `json:"p99_ms"`
	MaxMs   float64 `json:"max_ms"`
	N       int     `json:"n"`
}

// Summary returns the variant's JSON summary.
func (v *VariantResult) Summary() Summary {
	s := Summary{Variant: v.Variant, Runs: len(v.Runs)}
	pick := func(f func(Run) time.Duration) float64 {
		ds := make([]time.Duration, len(v.Runs))
		for i, r := range v.Runs {
			ds[i] = f(r)
		}
		return probe.RoundMs(probe.Median(ds))
	}
	s.P50Ms = pick(func(r Run) time.Duration { return r.P50 })
	s.P95Ms = pick(func(r Run) time.Duration { return r.P95 })
	s.P99Ms = pick(func(r Run) time.Duration { return r.P99 })
	s.MaxMs = pick(func(r Run) time.Duration { return r.Max })
	for _, r := range v.Runs {
		s.N += len(r.Samples)
	}
	return s
}

// Lost returns the messages lost over all runs.
func (v *VariantResult) Lost() int {
	n := 0
	for _, r := range v.Runs {
		n += r.Lost
	}
	return n
}

// Samples returns every run's samples together, sorted.
func (v *VariantResult) Samples() []time.Duration {
	var all []time.Duration
	for _, r := range v.Runs {
		all = append(all, r.Samples...)
	}
	slices.Sort(all)
	return all
}

// Measure runs the write-up's latency experiment: per variant a fresh
// environment (private servers, both services as processes, every role in
// each) reused by its runs; per run a new chat, a WebSocket watcher on
// workers for it, one unmeasured warm-up message, then Messages sends from
// consumers' HTTP API one every Interval, each message's latency running
// from the start of its send call to the arrival of its frame at the
// watcher. VariantEdit and VariantRead time edits and read marks the same
// way on v2's environment (changeRun). The floors are measured on the v2
// environment after its runs. An error means the experiment could not run;
// lost messages are reported, not errors.
func Measure(ctx context.Context, opts Options) (*Report, error) {
	if len(opts.Variants) == 0 {
		opts.Variants = DefaultVariants
	}
	for _, v := range opts.Variants {
		if err := checkLatencyVariant(v); err != nil {
			return nil, err
		}
	}
	orDefault(&opts.Messages, DefaultMessages)
	orDefault(&opts.Interval, DefaultInterval)
	orDefault(&opts.Runs, DefaultRuns)
	orDefault(&opts.Settle, DefaultSettle)
	orDefault(&opts.Instances, 1)
	if opts.FloorSamples == 0 {
		opts.FloorSamples = DefaultFloorSamples
	}
	progress := opts.Progress
	if progress == nil {
		progress = io.Discard
	}
	floorsOn := env.VariantV2
	if !slices.Contains(opts.Variants, env.VariantV2) {
		floorsOn = opts.Variants[0]
	}
	rep := &Report{Messages: opts.Messages, Interval: opts.Interval, Runs: opts.Runs, Durable: opts.Durable, Instances: opts.Instances}
	for _, v := range opts.Variants {
		vl, floors, err := latencyVariant(ctx, v, opts, v == floorsOn && opts.FloorSamples > 0, progress)
		if err != nil {
			return nil, err
		}
		rep.Variants = append(rep.Variants, *vl)
		if floors != nil {
			rep.Floors = floors
		}
	}
	return rep, nil
}

// latencyVariant measures one variant on its own environment.
func latencyVariant(ctx context.Context, variant string, opts Options, floors bool, progress io.Writer) (*VariantResult, *Floors, error) {
	// The services run as `outboxchat serve` runs by default: api, relay and
	// worker roles in one process each. The relay's wake-up travels the
	// variant's way: in v2 the API wakes the relay in its process directly
	// after commit (and NOTIFYs relays elsewhere); in v2-intx only the NOTIFY
	// sent at commit wakes it (through its LISTEN); v2-poll has no wake-up.
	e, err := env.Start(ctx, env.Options{Variant: envVariant(variant), Progress: progress, Durable: opts.Durable, APIs: opts.Instances})
	if err != nil {
		return nil, nil, err
	}
	defer e.Close()
	vl := &VariantResult{Variant: variant}
	for run := 1; run <= opts.Runs; run++ {
		fmt.Fprintf(progress, "lab: latency %s run %d/%d: %d messages, one every %v\n", variant, run, opts.Runs, opts.Messages, opts.Interval)
		var r *Run
		if isChangeVariant(variant) {
			r, err = changeRun(ctx, e, variant, int64(run), opts)
		} else {
			r, err = latencyRun(ctx, e, int64(run), opts)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("lab: latency %s run %d: %w", variant, run, err)
		}
		fmt.Fprintf(progress, "lab: latency %s run %d/%d: p50 %s ms, p95 %s ms, lost %d\n", variant, run, opts.Runs, probe.FmtMs(r.P50), probe.FmtMs(r.P95), r.Lost)
		vl.Runs = append(vl.Runs, *r)
	}
	var f *Floors
	if floors {
		fmt.Fprintf(progress, "lab: measuring floors (%d round trips each back to back, %d one per %v)\n",
			opts.FloorSamples, PacedFloorSamples, opts.Interval)
		if f, err = MeasureFloors(ctx, e, opts.FloorSamples, opts.Interval); err != nil {
			return nil, nil, err
		}
	}
	return vl, f, nil
}

// latencyRun runs one run on chat chatID of e.
func latencyRun(ctx context.Context, e *env.Env, chatID int64, opts Options) (*Run, error) {
	var mu sync.Mutex
	arrived := map[string]probe.Shown{}
	// One URL per instance; the watcher on the last workers instance.
	sendTo := []string{e.ConsumersURL}
	for _, p := range e.ConsumersAPIs {
		sendTo = append(sendTo, p.URL())
	}
	watchAt := e.WorkersURL
	if n := len(e.WorkersAPIs); n > 0 {
		watchAt = e.WorkersAPIs[n-1].URL()
	}
	w, err := watch(ctx, watchAt, chatID, &probe.WatcherConfig{Token: e.Token, OnFrame: func(s probe.Shown) {
		if s.Message.From != chat.Consumers || s.Duplicate {
			return
		}
		mu.Lock()
		arrived[s.Message.ID] = s
		mu.Unlock()
	}})
	if err != nil {
		return nil, err
	}
	defer w.Stop(context.Background())
	shown := func(id string) bool {
		mu.Lock()
		defer mu.Unlock()
		_, ok := arrived[id]
		return ok
	}

	snds := make([]*probe.ConnSender, len(sendTo))
	for i, u := range sendTo {
		if snds[i], err = probe.NewConnSender(u, e.Token, 5*time.Second); err != nil {
			return nil, err
		}
		defer snds[i].Close()
	}
	// Warm-up: connections, prepared statements and the first wake-up are
	// paid by a message per instance that is not measured.
	for _, snd := range snds {
		warmID, err := snd.Send(ctx, chatID, "warm-up")
		if err != nil {
			return nil, fmt.Errorf("warm-up send: %w", err)
		}
		wctx, cancel := context.WithTimeout(ctx, opts.Settle)
		err = env.WaitFor(wctx, 5*time.Millisecond, func() bool { return shown(warmID) })
		cancel()
		if err != nil {
			return nil, fmt.Errorf("warm-up message not shown within %v", opts.Settle)
		}
	}

	type sent struct {
		id string
		at time.Time
	}
	var sends []sent
	r := &Run{}
	next := time.Now()
	for i := 1; i <= opts.Messages; i++ {
		if err := env.SleepUntil(ctx, next); err != nil {
			return nil, err
		}
		t0 := time.Now()
		next = t0.Add(opts.Interval)
		id, err := snds[i%len(snds)].Send(ctx, chatID, fmt.Sprintf("msg %d", i))
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			r.SendErrors++
			continue
		}
		sends = append(sends, sent{id, t0})
	}
	r.Sent = len(sends)
	sctx, cancel := context.WithTimeout(ctx, opts.Settle)
	_ = env.WaitFor(sctx, 10*time.Millisecond, func() bool {
		for _, s := range sends {
			if !shown(s.id) {
				return false
			}
		}
		return true
	})
	cancel()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	var st probe.StageSamples
	mu.Lock()
	for _, s := range sends {
		sh, ok := arrived[s.id]
		if !ok {
			r.Lost++
			continue
		}
		r.Samples = append(r.Samples, sh.At.Sub(s.at))
		st.Add(s.at, sh)
	}
	mu.Unlock()
	r.Stages = st.P50()
	r.DuplicatesShown = w.Duplicates()
	r.summarize()
	return r, nil
}

// summarize sorts r.Samples and sets P50, P95, P99 and Max from them.
func (r *Run) summarize() {
	slices.Sort(r.Samples)
	r.P50, r.P95, r.P99 = probe.Percentile(r.Samples, 0.50), probe.Percentile(r.Samples, 0.95), probe.Percentile(r.Samples, 0.99)
	if n := len(r.Samples); n > 0 {
		r.Max = r.Samples[n-1]
	}
}

// watch starts a watcher of chat chatID at url with cfg and waits (up to
// probe.ConnectTimeout) for its first connection; the caller stops it.
func watch(ctx context.Context, url string, chatID int64, cfg *probe.WatcherConfig) (*probe.Watcher, error) {
	w, err := probe.NewWatcher(url, chatID, cfg)
	if err != nil {
		return nil, err
	}
	if err := w.Start(ctx); err != nil {
		return nil, err
	}
	if err := probe.Connect(ctx, w); err != nil {
		_ = w.Stop(context.Background())
		return nil, fmt.Errorf("watcher could not connect to %s: %w", url, err)
	}
	return w, nil
}

// WriteTable prints the write-up's table: p50, p95 and p99 as min to max
// over runs, the worst latency of all runs, runs; then losses and the
// floors.
func (r *Report) WriteTable(w io.Writer) {
	inst := ""
	if r.Instances > 1 {
		inst = fmt.Sprintf("; %d instances per service (sends to each in turn, the client on the last)", r.Instances)
	}
	fmt.Fprintf(w, "latency: %d messages per run, one every %v; send call → frame at a workers WebSocket client%s\n",
		r.Messages, r.Interval, inst)
	if slices.ContainsFunc(r.Variants, func(v VariantResult) bool { return isChangeVariant(v.Variant) }) {
		fmt.Fprintf(w, "edit, read: as many changes, as paced: edit call → edit frame at the workers' client; read call (a workers reader) → read frame at the consumers' client\n")
	}
	fmt.Fprintf(w, "servers: %s\n\n", env.ServerMode(r.Durable))
	rows := [][]string{{"variant", "p50", "p95", "p99", "max", "runs"}}
	for _, v := range r.Variants {
		col := func(f func(Run) time.Duration) []time.Duration {
			out := make([]time.Duration, len(v.Runs))
			for i, run := range v.Runs {
				out[i] = f(run)
			}
			return out
		}
		maxes := col(func(x Run) time.Duration { return x.Max })
		worst := "-"
		if len(maxes) > 0 {
			worst = probe.FmtMs(slices.Max(maxes)) + " ms"
		}
		rows = append(rows, []string{variantLabel(v.Variant),
			probe.FmtRange(col(func(x Run) time.Duration { return x.P50 })),
			probe.FmtRange(col(func(x Run) time.Duration { return x.P95 })),
			probe.FmtRange(col(func(x Run) time.Duration { return x.P99 })),
			worst, fmt.Sprint(len(v.Runs))})
	}
	probe.WriteColumns(w, rows)
	var lost []string
	for _, v := range r.Variants {
		if n := v.Lost(); n > 0 {
			lost = append(lost, fmt.Sprintf("%s: %d", v.Variant, n))
		}
	}
	if len(lost) == 0 {
		fmt.Fprintln(w, "\nlost: none")
	} else {
		fmt.Fprintf(w, "\nlost: %s\n", strings.Join(lost, ", "))
	}
	fmt.Fprintln(w, "\nwhere the time goes (p50 per leg, median over runs; sent_at and received_at are the send and inbox transactions' start):")
	rows = [][]string{{"variant", "call → send tx", "send tx → inbox tx", "inbox tx → shown"}}
	for _, v := range r.Variants {
		if isChangeVariant(v.Variant) {
			continue // no send or inbox transaction of a message to split at
		}
		var a, b, c []time.Duration
		for _, run := range v.Runs {
			a, b, c = append(a, run.Stages.ToSendTx), append(b, run.Stages.SendToInboxTx), append(c, run.Stages.InboxTxToShown)
		}
		rows = append(rows, []string{"  " + v.Variant, probe.FmtMs(probe.Median(a)) + " ms", probe.FmtMs(probe.Median(b)) + " ms", probe.FmtMs(probe.Median(c)) + " ms"})
	}
	probe.WriteColumns(w, rows)
	if r.Floors != nil {
		fmt.Fprintln(w)
		r.Floors.Write(w, r.V2P50())
	}
}

// V2P50 returns v2's p50 (median over runs), 0 when v2 was not measured.
func (r *Report) V2P50() time.Duration {
	for _, v := range r.Variants {
		if v.Variant == env.VariantV2 {
			ds := make([]time.Duration, len(v.Runs))
			for i, run := range v.Runs {
				ds[i] = run.P50
			}
			return probe.Median(ds)
		}
	}
	return 0
}

// WriteJSON prints one Summary per variant, one JSON object per line.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	for _, v := range r.Variants {
		if err := enc.Encode(v.Summary()); err != nil {
			return fmt.Errorf("lab: write json: %w", err)
		}
	}
	return nil
}
