package lab

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = i + 1
	}
	for _, tc := range []struct {
		name string
		s    []time.Duration
		p    float64
		want time.Duration
	}{
		{"empty", nil, 0.5, 0},
		{"one", ms(7), 0.99, 7 * time.Millisecond},
		{"p50 of 1..100", ms(hundred...), 0.50, 50 * time.Millisecond},
		{"p95 of 1..100", ms(hundred...), 0.95, 95 * time.Millisecond},
		{"p99 of 1..100", ms(hundred...), 0.99, 99 * time.Millisecond},
		{"p100 of 1..100", ms(hundred...), 1, 100 * time.Millisecond},
		{"p50 of 4", ms(1, 2, 3, 4), 0.5, 2 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := percentile(tc.s, tc.p); got != tc.want {
				t.Fatalf("percentile(%v) = %v, want %v", tc.p, got, tc.want)
			}
		})
	}
}

func TestMedianAndFormat(t *testing.T) {
	d := func(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }
	for _, tc := range []struct {
		in   []time.Duration
		want time.Duration
	}{
		{nil, 0}, {[]time.Duration{d(3)}, d(3)}, {[]time.Duration{d(9), d(1), d(5)}, d(5)}, {[]time.Duration{d(4), d(2)}, d(3)},
	} {
		if got := medianDuration(tc.in); got != tc.want {
			t.Errorf("medianDuration(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
	for _, tc := range []struct {
		in   []time.Duration
		want string
	}{
		{nil, "-"},
		{[]time.Duration{d(1.234), d(1.5)}, "1.23 to 1.50 ms"},
		{[]time.Duration{d(534.2), d(541)}, "534 to 541 ms"},
		{[]time.Duration{d(18.04), d(18.01)}, "18.0 ms"},
	} {
		if got := fmtRange(tc.in); got != tc.want {
			t.Errorf("fmtRange(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
	if got := roundMs(1234567 * time.Nanosecond); got != 1.235 {
		t.Errorf("roundMs = %v, want 1.235", got)
	}
	for _, tc := range []struct{ x, lo, hi float64 }{{0.49, 0.1, 1}, {1, 1, 1}, {7.3, 1, 10}, {1000, 1000, 1000}, {1001, 1000, 10000}} {
		if lo, hi := decadeFloor(tc.x), decadeCeil(tc.x); lo != tc.lo || hi != tc.hi {
			t.Errorf("decades of %v = %v, %v; want %v, %v", tc.x, lo, hi, tc.lo, tc.hi)
		}
	}
}

// syntheticReport is a report as Latency would make it, without servers.
func syntheticReport() *LatencyReport {
	run := func(base time.Duration, n int) LatencyRun {
		r := LatencyRun{Sent: n}
		for i := range n {
			r.Samples = append(r.Samples, base+time.Duration(i)*base/time.Duration(n))
		}
		r.P50, r.P95, r.P99 = percentile(r.Samples, .5), percentile(r.Samples, .95), percentile(r.Samples, .99)
		r.Max = r.Samples[n-1]
		return r
	}
	return &LatencyReport{Messages: 100, Interval: 100 * time.Millisecond, Runs: 2,
		Variants: []VariantLatency{
			{Variant: VariantV1, Runs: []LatencyRun{run(time.Millisecond, 100), run(2*time.Millisecond, 100)}},
			{Variant: VariantV2, Runs: []LatencyRun{run(2*time.Millisecond, 100), run(3*time.Millisecond, 100)}},
			{Variant: VariantV2Poll, Runs: []LatencyRun{run(20*time.Millisecond, 100), run(30*time.Millisecond, 100)}},
		},
		Floors: &Floors{Commit: 200 * time.Microsecond, RedisPing: 50 * time.Microsecond, NotifyWake: 250 * time.Microsecond,
			Samples: 200, Fsync: "off", SynchronousCommit: "on",
			Paced: &PacedFloors{Commit: time.Millisecond, RedisPing: 500 * time.Microsecond, NotifyWake: time.Millisecond,
				Pace: 100 * time.Millisecond, Samples: 30}}}
}

func TestLatencyReportOutput(t *testing.T) {
	rep := syntheticReport()
	var tb bytes.Buffer
	rep.WriteTable(&tb)
	for _, want := range []string{"v1: plain queue add", "v2-poll: polling only, 1 s", "1.49 to 2.98 ms", "lost: none",
		"NOTIFY wake-up", "one per 100ms idle (30)",
		"v2 p50 / floors sum: 3.73 ms / 0.50 ms = 7.5x back to back; / 2.50 ms = 1.5x at the test's pace"} {
		if !strings.Contains(tb.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, tb.String())
		}
	}
	var jb bytes.Buffer
	if err := rep.WriteJSON(&jb); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(jb.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("want 3 JSON lines, got %d:\n%s", len(lines), jb.String())
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(lines[1]), &m); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"variant": "v2", "runs": 2.0, "p50_ms": 3.725, "n": 200.0}
	for k, v := range want {
		if m[k] != v {
			t.Errorf("json %s = %v, want %v (%s)", k, m[k], v, lines[1])
		}
	}
	if len(m) != 7 {
		t.Errorf("json has %d fields, want exactly variant, runs, p50_ms, p95_ms, p99_ms, max_ms, n: %s", len(m), lines[1])
	}
}

func TestLatencyPlotFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "cdf.png")
	got, err := WriteLatencyPlot(path, syntheticReport())
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(got)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte("\x89PNG")) || len(b) < 10000 {
		t.Fatalf("%s: not a plausible PNG (%d bytes)", got, len(b))
	}
	if _, err := WriteLatencyPlot(path, &LatencyReport{}); err == nil {
		t.Error("plot of an empty report: want an error")
	}
}

func TestLatencyCmdRejects(t *testing.T) {
	for _, args := range [][]string{
		{"--runs", "0"}, {"--messages", "-1"}, {"--variants", "v3"}, {"--variants", ","}, {"extra"},
	} {
		var out, errb bytes.Buffer
		if err := runLatencyCmd(context.Background(), args, &out, &errb); err == nil {
			t.Errorf("lab latency %q: want an error", args)
		}
	}
}

// TestLatencyCmd runs `lab latency` end to end on one short run of v2:
// structure and sane figures, never timing targets.
func TestLatencyCmd(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	plotPath := filepath.Join(t.TempDir(), "cdf.png")
	var out, errb bytes.Buffer
	err := runLatencyCmd(ctx, []string{"--variants", "v2", "--messages", "20", "--interval", "50ms", "--runs", "1",
		"--json", "--plot", plotPath}, &out, &errb)
	if err != nil {
		t.Fatalf("lab latency: %v\nstderr:\n%s", err, errb.String())
	}
	t.Logf("stdout:\n%s\nstderr:\n%s", out.String(), errb.String())
	sc := bufio.NewScanner(&out)
	var sums []LatencySummary
	for sc.Scan() {
		var s LatencySummary
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		sums = append(sums, s)
	}
	if len(sums) != 1 {
		t.Fatalf("want one JSON line, got %d", len(sums))
	}
	s := sums[0]
	if s.Variant != VariantV2 || s.Runs != 1 || s.N != 20 {
		t.Errorf("summary = %+v; want variant v2, 1 run, n 20 (nothing lost)", s)
	}
	if !(s.P50Ms > 0 && s.P50Ms <= s.P95Ms && s.P95Ms <= s.P99Ms && s.P99Ms <= s.MaxMs) {
		t.Errorf("percentiles not ordered and positive: %+v", s)
	}
	for _, want := range []string{"INSERT+COMMIT round trip", "v2 p50 / floors sum", "plot: " + plotPath} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("stderr lacks %q", want)
		}
	}
	if st, err := os.Stat(plotPath); err != nil || st.Size() == 0 {
		t.Errorf("plot %s: %v", plotPath, err)
	}
}

// With polling only, a message waits for the relay's 1 s poll: nothing else
// may wake the relay. Regression: an inbox commit's receipt wake-up also
// woke the poll-only relay, and v2-poll's p50 was 50 ms (the receipt wake
// delay) instead of about half the poll. 20 messages 50 ms apart span one
// poll interval, so however the polls fall the median waits at least about
// a quarter of it; 150 ms leaves room, and a slow machine only adds.
func TestLatencyPollOnlyWaitsForThePoll(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	// --plot none: the default plot path is relative to the package
	// directory, and a test must not write into the source tree.
	err := runLatencyCmd(ctx, []string{"--variants", "v2-poll", "--messages", "20", "--interval", "50ms", "--runs", "1",
		"--json", "--plot", "none"}, &out, &errb)
	if err != nil {
		t.Fatalf("lab latency: %v\nstderr:\n%s", err, errb.String())
	}
	var s LatencySummary
	if err := json.Unmarshal(bytes.TrimSpace(out.Bytes()), &s); err != nil {
		t.Fatalf("output %q: %v", out.String(), err)
	}
	if s.Variant != VariantV2Poll || s.N != 20 {
		t.Fatalf("summary = %+v; want v2-poll, n 20", s)
	}
	if s.P50Ms < 150 {
		t.Errorf("v2-poll p50 = %.1f ms; want >= 150 ms (something woke the poll-only relay)", s.P50Ms)
	}
}

// ExampleLatency measures v2's latency on one short run and prints the
// write-up's table and the floors (it needs postgres and redis-server).
func ExampleLatency() {
	rep, err := Latency(context.Background(), LatencyOptions{Variants: []string{VariantV2}, Messages: 20, Runs: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	rep.WriteTable(os.Stdout)
	if path, err := WriteLatencyPlot(filepath.Join(os.TempDir(), "latency-cdf.png"), rep); err == nil {
		fmt.Println("plot:", path)
	}
}
