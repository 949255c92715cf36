package latency

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/lab/env"
	"github.com/outboxchat/outboxchat/lab/probe"
)

// syntheticReport is a report as Measure would make it, without servers.
func syntheticReport() *Report {
	run := func(base time.Duration, n int) Run {
		r := Run{Sent: n}
		for i := range n {
			r.Samples = append(r.Samples, base+time.Duration(i)*base/time.Duration(n))
		}
		r.P50, r.P95, r.P99 = probe.Percentile(r.Samples, .5), probe.Percentile(r.Samples, .95), probe.Percentile(r.Samples, .99)
		r.Max = r.Samples[n-1]
		return r
	}
	return &Report{Messages: 100, Interval: 100 * time.Millisecond, Runs: 2,
		Variants: []VariantResult{
			{Variant: env.VariantV1, Runs: []Run{run(time.Millisecond, 100), run(2*time.Millisecond, 100)}},
			{Variant: env.VariantV2, Runs: []Run{run(2*time.Millisecond, 100), run(3*time.Millisecond, 100)}},
			{Variant: env.VariantV2Poll, Runs: []Run{run(20*time.Millisecond, 100), run(30*time.Millisecond, 100)}},
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
	got, err := WritePlot(path, syntheticReport())
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
	if _, err := WritePlot(path, &Report{}); err == nil {
		t.Error("plot of an empty report: want an error")
	}
}

// ExampleMeasure measures v2's latency on one short run and prints the
// write-up's table and the floors (it needs postgres and redis-server).
func ExampleMeasure() {
	rep, err := Measure(context.Background(), Options{Variants: []string{env.VariantV2}, Messages: 20, Runs: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	rep.WriteTable(os.Stdout)
	if path, err := WritePlot(filepath.Join(os.TempDir(), "latency-cdf.png"), rep); err == nil {
		fmt.Println("plot:", path)
	}
}

func TestDecades(t *testing.T) {
	for _, tc := range []struct{ x, lo, hi float64 }{{0.49, 0.1, 1}, {1, 1, 1}, {7.3, 1, 10}, {1000, 1000, 1000}, {1001, 1000, 10000}} {
		if lo, hi := decadeFloor(tc.x), decadeCeil(tc.x); lo != tc.lo || hi != tc.hi {
			t.Errorf("decades of %v = %v, %v; want %v, %v", tc.x, lo, hi, tc.lo, tc.hi)
		}
	}
}
