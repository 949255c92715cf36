package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/cmd/outboxchat/internal/labcmd"
	"github.com/outboxchat/outboxchat/lab/env"
	"github.com/outboxchat/outboxchat/lab/latency"
)

func TestLatencyCmdRejects(t *testing.T) {
	for _, args := range [][]string{
		{"--runs", "0"}, {"--messages", "-1"}, {"--variants", "v3"}, {"--variants", ","}, {"extra"}, {"--instances", "0"},
	} {
		var out, errb bytes.Buffer
		if err := labcmd.Latency(context.Background(), args, &out, &errb); err == nil {
			t.Errorf("lab latency %q: want an error", args)
		}
	}
}

// TestLatencyCmd runs `lab latency` end to end on one short run of v2
// with two instances of each service (sends to both consumers instances,
// the watcher on the second workers instance: nothing lost whichever
// instance stores a message): structure and sane figures, never timing
// targets.
func TestLatencyCmd(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	plotPath := filepath.Join(t.TempDir(), "cdf.png")
	sums, stderr := latencyJSON(ctx, t, "--variants", "v2", "--messages", "20", "--interval", "50ms", "--runs", "1",
		"--instances", "2", "--plot", plotPath)
	t.Logf("summaries: %+v\nstderr:\n%s", sums, stderr)
	if len(sums) != 1 {
		t.Fatalf("want one JSON line, got %d", len(sums))
	}
	s := sums[0]
	if s.Variant != env.VariantV2 || s.Runs != 1 || s.N != 20 {
		t.Errorf("summary = %+v; want variant v2, 1 run, n 20 (nothing lost)", s)
	}
	if !(s.P50Ms > 0 && s.P50Ms <= s.P95Ms && s.P95Ms <= s.P99Ms && s.P99Ms <= s.MaxMs) {
		t.Errorf("percentiles not ordered and positive: %+v", s)
	}
	for _, want := range []string{"starting 4 service processes", "INSERT+COMMIT round trip", "v2 p50 / floors sum", "plot: " + plotPath, "servers: fast: postgres fsync=off"} {
		if !strings.Contains(stderr, want) {
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
	// --plot none: the default plot path is relative to the package
	// directory, and a test must not write into the source tree.
	sums, _ := latencyJSON(ctx, t, "--variants", "v2-poll", "--messages", "20", "--interval", "50ms", "--runs", "1", "--plot", "none")
	if len(sums) != 1 {
		t.Fatalf("want one JSON line, got %d", len(sums))
	}
	s := sums[0]
	if s.Variant != env.VariantV2Poll || s.N != 20 {
		t.Fatalf("summary = %+v; want v2-poll, n 20", s)
	}
	if s.P50Ms < 150 {
		t.Errorf("v2-poll p50 = %.1f ms; want >= 150 ms (something woke the poll-only relay)", s.P50Ms)
	}
}

// TestLatencyEditAndRead runs the edit and read variants on one short run:
// every edit and every read mark is shown once at the other side's client
// (n counts them); the table names both. Whether they are woken, not
// polled, is chat/server's listen_test.go (by counters, not timings).
func TestLatencyEditAndRead(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	got, _ := latencyJSON(ctx, t, "--variants", "edit,read", "--messages", "10", "--interval", "20ms", "--runs", "1", "--plot", "none")
	if len(got) != 2 || got[0].Variant != latency.VariantEdit || got[1].Variant != latency.VariantRead {
		t.Fatalf("summaries = %+v; want edit then read", got)
	}
	for _, s := range got {
		if s.Runs != 1 || s.N != 10 || s.P50Ms <= 0 {
			t.Errorf("%s summary = %+v; want 1 run, n 10 (every change shown), a positive p50", s.Variant, s)
		}
	}
	var out, errb bytes.Buffer
	if err := labcmd.Latency(ctx, []string{"--variants", "read", "--messages", "3", "--runs", "1", "--plot", "none"}, &out, &errb); err != nil {
		t.Fatalf("lab latency (table): %v\nstderr:\n%s", err, errb.String())
	}
	for _, want := range []string{"read: v2, a read mark → its read frame", "read call (a workers reader)", "lost: none"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

// latencyJSON runs `lab latency --json` with args and returns its
// summaries (one JSON line per variant) and its stderr; a failed run or a
// line that is not a summary fails t.
func latencyJSON(ctx context.Context, t *testing.T, args ...string) ([]latency.Summary, string) {
	t.Helper()
	var out, errb bytes.Buffer
	if err := labcmd.Latency(ctx, append(args, "--json"), &out, &errb); err != nil {
		t.Fatalf("lab latency: %v\nstderr:\n%s", err, errb.String())
	}
	var sums []latency.Summary
	for line := range strings.Lines(strings.TrimSpace(out.String())) {
		var s latency.Summary
		if err := json.Unmarshal([]byte(line), &s); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		sums = append(sums, s)
	}
	return sums, errb.String()
}
