package lab

import (
	"bufio"
	"context"
	"net"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/internal/labfault"
)

// tortureTestSeed draws, for the 5 short schedules of make test, two
// topologies with two API processes and two relays per service, one with
// everything in one process per service, and faults of every family:
// SIGKILL, SIGSTOP, SIGTERM, a worker crash before its inbox commit, Redis
// kill -9 and graceful stop, Postgres fast restart, toxiproxy latency,
// reset_peer, bandwidth and black-hole; malformed entries in two.
const tortureTestSeed = 5

// TestTortureShort runs the 5 short schedules: each a fresh topology on
// private servers, load both ways, clients dropping and reconnecting, a
// random fault sequence, then the drain and the checker. Budget: about
// 15 s a schedule (75 s on an idle 2-core machine).
func TestTortureShort(t *testing.T) {
	if testing.Short() {
		t.Skip("starts private servers and service processes")
	}
	t.Parallel()
	var progress strings.Builder
	res, err := Torture(context.Background(), TortureOptions{Schedules: 5, Seed: tortureTestSeed, Duration: 6 * time.Second, Progress: &progress})
	t.Log("\n" + progress.String())
	if err != nil {
		t.Fatal(err)
	}
	if res.Schedules != 5 || res.Failed != 0 || res.Lost != 0 || res.DuplicatesShown != 0 || res.OrderViolations != 0 {
		t.Fatalf("want 5 schedules, none failed: %+v", res)
	}
	if res.Sent < 100 {
		t.Errorf("only %d sends answered 201: the load did not run", res.Sent)
	}
	drawn := 0
	for _, n := range res.Faults {
		drawn += n
	}
	if drawn < 10 {
		t.Errorf("only %d faults drawn: %v", drawn, res.Faults)
	}
	for _, r := range res.Runs {
		if r.Reconnects == 0 {
			t.Errorf("schedule %d: the clients never reconnected", r.Schedule)
		}
	}
}

// TestDrawScheduleReplays: a (seed, schedule) pair always draws the same
// schedule (what --seed S --schedule K relies on), other pairs differ, and
// every fault names a process or link of its topology.
func TestDrawScheduleReplays(t *testing.T) {
	a, b := drawSchedule(42, 3, 20*time.Second), drawSchedule(42, 3, 20*time.Second)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("the same seed and schedule drew two schedules:\n%+v\n%+v", a, b)
	}
	if reflect.DeepEqual(a, drawSchedule(42, 4, 20*time.Second)) || reflect.DeepEqual(a, drawSchedule(43, 3, 20*time.Second)) {
		t.Fatal("another seed or schedule drew the same schedule")
	}
	kinds := map[string]bool{}
	for k := 1; k <= 200; k++ {
		s := drawSchedule(7, k, 20*time.Second)
		workers, relays := s.procNames()
		names := map[string]bool{}
		for _, n := range append(workers, relays...) {
			names[n] = true
		}
		for i, f := range s.Faults {
			kinds[f.kind()] = true
			if i > 0 && f.At < s.Faults[i-1].At {
				t.Fatalf("schedule %d: faults not in time order", k)
			}
			switch f.Kind {
			case faultKill, faultStop, faultTerm, faultCrashPoint:
				if !names[f.Target] {
					t.Fatalf("schedule %d: fault %s targets a process the topology lacks (%v)", k, f, names)
				}
			case faultNet:
				if !strings.Contains(f.Target, ">") {
					t.Fatalf("schedule %d: fault %s has no link", k, f)
				}
			}
		}
	}
	for _, want := range []string{faultKill, faultStop, faultTerm, labfault.RelayAfterPublish, labfault.WorkerBeforeCommit,
		labfault.WorkerAfterCommit, faultRedisKill, faultRedisStop, faultPgImm, faultPgFast,
		"net-" + NetLatency, "net-" + NetTimeout, "net-" + NetReset, "net-" + NetBandwidth, "net-" + NetBlackHole} {
		if !kinds[want] {
			t.Errorf("200 schedules never drew %s", want)
		}
	}
}

// TestCheckViewCatches: the client-side checker flags a frame twice on one
// connection, a seq that goes down on one connection and a seq never
// shown, and allows a repeat after a reconnect.
func TestCheckViewCatches(t *testing.T) {
	fr := func(conn int, from string, seq int64) Shown {
		return Shown{Conn: conn, Message: chat.Message{ID: from + string(rune('a'+seq)), ChatID: 1, Seq: seq, From: from}}
	}
	c, w := chat.Consumers, chat.Workers
	tops := map[string]map[int64]int64{c: {1: 3}, w: {1: 1}}
	for _, tc := range []struct {
		name                        string
		frames                      []Shown
		dups, order, missing, extra int
	}{
		{"clean, a repeat after a reconnect", []Shown{fr(1, c, 1), fr(1, w, 1), fr(1, c, 2), fr(2, c, 2), fr(2, c, 3)}, 0, 0, 0, 0},
		{"twice on one connection", []Shown{fr(1, c, 1), fr(1, c, 1), fr(1, c, 2), fr(1, c, 3), fr(1, w, 1)}, 1, 0, 0, 0},
		{"order broken on one connection", []Shown{fr(1, c, 2), fr(1, c, 1), fr(1, c, 3), fr(1, w, 1)}, 0, 1, 0, 0},
		{"one never shown", []Shown{fr(1, c, 1), fr(2, c, 3), fr(2, w, 1)}, 0, 0, 1, 0},
		{"one never stored", []Shown{fr(1, c, 1), fr(1, c, 2), fr(1, c, 3), fr(1, c, 4), fr(1, w, 1)}, 0, 0, 0, 1},
	} {
		v := checkView(tc.frames, 1, tops)
		if len(v.dups) != tc.dups || len(v.order) != tc.order || len(v.missing) != tc.missing || len(v.extra) != tc.extra {
			t.Errorf("%s: got %+v", tc.name, v)
		}
	}
}

// TestStreamTapOrder: the stream tap allows a re-sent seq and flags a new
// seq below the highest of its chat.
func TestStreamTapOrder(t *testing.T) {
	tap := &streamTap{seen: map[string]map[int64]map[int64]bool{chat.Consumers: {}}, top: map[string]map[int64]int64{chat.Consumers: {}}}
	entry := func(chatID, seq int64) {
		tap.entry(chat.Consumers, redis.XMessage{ID: "1-0", Values: map[string]any{
			"name": chat.EventMessageCreated, "payload": `{"chat_id":` + strconv.FormatInt(chatID, 10) + `,"seq":` + strconv.FormatInt(seq, 10) + `}`}})
	}
	entry(1, 1)
	entry(1, 2)
	entry(2, 1)
	entry(1, 1) // a re-send (relay crash, re-drive): allowed
	entry(1, 3)
	tap.entry(chat.Consumers, redis.XMessage{ID: "1-1", Values: map[string]any{"name": chat.EventMessageCreated, "payload": "{not an event"}})
	if v := tap.violations(); len(v) != 0 {
		t.Fatalf("in-order entries flagged: %v", v)
	}
	entry(1, 5)
	entry(1, 4) // published after 5: out of order
	if v := tap.violations(); len(v) != 1 || !strings.Contains(v[0], "chat 1 seq 4 added after seq 5") {
		t.Fatalf("want seq 4 after 5 flagged, got %v", v)
	}
}

// TestNetFaults: a route through the in-process toxiproxy passes bytes; a
// latency toxic delays them, a black-hole swallows them until removed.
func TestNetFaults(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // a line echo server
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					l, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(l)); err != nil {
						return
					}
				}
			}()
		}
	}()
	nf := newNetFaults()
	defer nf.close()
	addr, err := nf.route("svc", "echo", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	roundTrip := func(c net.Conn, r *bufio.Reader, wait time.Duration) (time.Duration, error) {
		start := time.Now()
		_ = c.SetDeadline(start.Add(wait))
		if _, err := c.Write([]byte("ping\n")); err != nil {
			return 0, err
		}
		_, err := r.ReadString('\n')
		return time.Since(start), err
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if _, err := roundTrip(c, r, 10*time.Second); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}
	name, err := nf.add("svc>echo", NetLatency, "downstream", map[string]int{"latency": 300})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := roundTrip(c, r, 10*time.Second); err != nil || d < 300*time.Millisecond {
		t.Fatalf("with 300 ms latency: round trip %v, %v", d, err)
	}
	nf.remove("svc>echo", name)
	if _, err := nf.add("svc>echo", NetBlackHole, "upstream", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := roundTrip(c, r, 500*time.Millisecond); err == nil {
		t.Fatal("a black-holed link answered")
	}
	nf.clear()
	c2, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, err := roundTrip(c2, bufio.NewReader(c2), 10*time.Second); err != nil {
		t.Fatalf("after the faults were cleared: %v", err)
	}
}
