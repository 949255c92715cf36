package scenario

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/lab/labtest"
	"github.com/outboxchat/outboxchat/lab/probe"
)

// TestScenarios runs every named scenario; each must keep the invariants
// (nothing lost, nothing shown twice, order kept, nothing left unsent).
func TestScenarios(t *testing.T) {
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			var log bytes.Buffer
			f, m, err := RunMeasured(ctx, name, Options{Log: &log})
			t.Logf("log:\n%s", log.String())
			if err != nil {
				t.Fatal(err)
			}
			if name == "cluster-reshard" && (m.MoveMs == 0 || m.MaxGapBeforeMs == 0 || m.MaxGapDuringMs == 0) {
				t.Errorf("measures %+v: want the move's length and the gaps before and during it", m)
			}
			if f.Saved == 0 || f.Received != f.Saved {
				t.Errorf("figures %+v: want every saved message received", *f)
			}
			// Lines the event log writes from the services' typed events
			// (chat.EventRedriven, redisq.EventDeletedPending), not log text.
			for _, want := range scenarioLogWants[name] {
				if !bytes.Contains(log.Bytes(), []byte(want)) {
					t.Errorf("event log lacks %q", want)
				}
			}
		})
	}
}

// scenarioLogWants lists, per scenario, event-log text each run must show.
var scenarioLogWants = map[string][]string{
	"redis-flush":          {"had no receipt: re-driven"},
	"stream-entry-deleted": {"found deleted from the stream", "had no receipt: re-driven"},
	"cluster-failover":     {"promoted to master", "had no receipt: re-driven"},
	"cluster-reshard":      {"moved from", "keys migrated one by one", "longest gap"},
}

// With the re-drive off, the Redis-loss scenarios really lose messages:
// the proof that they test something the re-drive heals. (3 minutes each:
// the failover scenario starts five Redis processes, and the machine may
// be busy. cluster-failover loses the same way; it is left out to keep
// the package's run short.)
func TestRedisLossWithoutRedriveLoses(t *testing.T) {
	for _, name := range []string{"redis-flush", "stream-entry-deleted", "redis-failover"} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			var log bytes.Buffer
			f, err := Run(ctx, name, Options{ExtraArgs: []string{"--redrive-after", "0"}, Log: &log})
			if !errors.Is(err, probe.ErrInvariant) {
				t.Fatalf("err = %v, want the invariant broken (lost); log:\n%s", err, log.String())
			}
			if len(f.Lost) == 0 || f.Redriven != 0 {
				t.Fatalf("figures %+v: want messages lost and none re-driven", *f)
			}
			t.Logf("lost without re-drive: %v", f.Lost)
		})
	}
}

// TestMain builds the outboxchat binary once: the scenarios start it as
// the services' processes.
func TestMain(m *testing.M) { labtest.Main(m, "lab-scenario-test-") }
