package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/cmd/outboxchat/internal/labcmd"
	"github.com/outboxchat/outboxchat/lab/env"
	"github.com/outboxchat/outboxchat/lab/perf"
)

func TestBenchCmdRejects(t *testing.T) {
	for _, args := range [][]string{{"--senders", "0"}, {"--chats", "-2"}, {"--variant", "v9"}, {"x"}} {
		var out, errb bytes.Buffer
		if err := labcmd.Bench(context.Background(), args, &out, &errb); err == nil {
			t.Errorf("lab bench %q: want an error", args)
		}
	}
}

// TestBenchCmd runs a small `lab bench --json`: nothing lost, nothing shown
// twice, every DESIGN.md field present. No timing assertions.
func TestBenchCmd(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	err := labcmd.Bench(ctx, []string{"--senders", "4", "--chats", "10", "--messages", "500", "--json", "--durable"}, &out, &errb)
	if err != nil {
		t.Fatalf("lab bench: %v\nstderr:\n%s", err, errb.String())
	}
	t.Logf("stdout:\n%s\nstderr:\n%s", out.String(), errb.String())
	var m map[string]any
	if err := json.Unmarshal(out.Bytes(), &m); err != nil {
		t.Fatalf("stdout is not one JSON object: %v\n%s", err, out.String())
	}
	for _, k := range []string{"senders", "chats", "messages", "duration_s", "throughput_msgs_per_s", "p50_ms", "p95_ms",
		"p99_ms", "lost", "duplicates_shown", "rss_mb", "redis_used_mb_before", "redis_used_mb_after", "cpu_s"} {
		if _, ok := m[k]; !ok {
			t.Errorf("json lacks %q", k)
		}
	}
	var r perf.BenchResult
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatal(err)
	}
	if r.Senders != 4 || r.Chats != 10 || r.Messages != 500 {
		t.Errorf("echoed options = %d/%d/%d", r.Senders, r.Chats, r.Messages)
	}
	if !r.Durable || !strings.Contains(errb.String(), "servers: durable: postgres fsync=on") {
		t.Errorf("--durable: json durable %v; the text names the servers' mode: %v", r.Durable, strings.Contains(errb.String(), "servers: durable"))
	}
	if r.Lost != 0 || r.DuplicatesShown != 0 {
		t.Errorf("lost %d, shown twice %d; want 0 and 0", r.Lost, r.DuplicatesShown)
	}
	if !(r.ThroughputMsgsPerS > 0 && r.P50Ms > 0 && r.P50Ms <= r.P95Ms && r.P95Ms <= r.P99Ms) {
		t.Errorf("implausible figures: %+v", r)
	}
	for _, p := range []string{env.ProcConsumers, env.ProcWorkers} {
		if r.RSSMB[p] <= 0 {
			t.Errorf("rss_mb[%s] = %v", p, r.RSSMB[p])
		}
	}
	for _, p := range []string{env.ProcConsumers, env.ProcWorkers, "postgres", "redis", "lab"} {
		if r.CPUS[p] <= 0 {
			t.Errorf("cpu_s[%s] = %v; want each process's CPU read", p, r.CPUS[p])
		}
	}
	if r.RedisUsedMBBefore <= 0 || r.RedisUsedMBAfter <= 0 {
		t.Errorf("redis used memory %v → %v", r.RedisUsedMBBefore, r.RedisUsedMBAfter)
	}
	for _, tb := range []string{"consumers.outbox", "workers.outbox"} {
		if r.OutboxBytesBefore[tb] <= 0 || r.OutboxBytesAfter[tb] <= 0 {
			t.Errorf("%s size %d → %d bytes; want both read", tb, r.OutboxBytesBefore[tb], r.OutboxBytesAfter[tb])
		}
	}
	if !strings.Contains(errb.String(), "lab: bench sending") && !strings.Contains(errb.String(), "lab: bench done") {
		t.Errorf("no progress line on stderr")
	}
}

// TestBenchCmdCounts runs a small `lab bench --counts --json`: the
// services' statements and Redis's commands are counted from the first
// send, and the send path's own work shows: the consumers' message INSERT
// and the workers' inbox INSERT, each at least once and at most once per
// message (group commits and batches), and an XADD per message.
func TestBenchCmdCounts(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const n = 300
	var out, errb bytes.Buffer
	err := labcmd.Bench(ctx, []string{"--senders", "4", "--chats", "10", "--messages", "300", "--counts", "--json"}, &out, &errb)
	if err != nil {
		t.Fatalf("lab bench: %v\nstderr:\n%s", err, errb.String())
	}
	var r perf.BenchResult
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatal(err)
	}
	if r.Lost != 0 {
		t.Fatalf("lost %d", r.Lost)
	}
	sum := func(who string, match func(string) bool) (calls int64) {
		for _, c := range r.Counts {
			if c.Who == who && match(c.What) {
				calls += c.Calls
			}
		}
		return calls
	}
	has := func(sub string) func(string) bool { return func(s string) bool { return strings.Contains(s, sub) } }
	if c := sum("consumers", has(`INSERT INTO "consumers".messages`)); c < 1 || c > n {
		t.Errorf("consumers' message INSERT: %d calls for %d messages", c, n)
	}
	if c := sum("workers", has(`INSERT INTO "workers".inbox`)); c < 1 || c > n {
		t.Errorf("workers' inbox INSERT: %d calls for %d messages", c, n)
	}
	if c := sum("redis", func(s string) bool { return s == "xadd" }); c < n {
		t.Errorf("redis xadd: %d calls for %d messages, want one each at least", c, n)
	}
	if !strings.Contains(errb.String(), "work per message shown (300)") {
		t.Errorf("the text output has no counts:\n%s", errb.String())
	}
}
