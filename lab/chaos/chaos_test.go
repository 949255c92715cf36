package chaos

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/lab/env"
	"github.com/outboxchat/outboxchat/lab/labtest"
	"github.com/outboxchat/outboxchat/lab/probe"
)

func runChaos(t *testing.T, variant string) (*probe.Figures, string) {
	t.Helper()
	return runChaosOn(t, variant, env.BrokerRedis)
}

// runChaosOn runs the experiment with the queue on broker.
func runChaosOn(t *testing.T, variant, broker string) (*probe.Figures, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var log bytes.Buffer
	start := time.Now()
	f, err := Run(ctx, Options{Variant: variant, Broker: broker, Log: &log})
	if err != nil {
		t.Fatalf("chaos %s: %v\nlog:\n%s", variant, err, log.String())
	}
	t.Logf("chaos %s took %v; log:\n%s", variant, time.Since(start).Round(time.Millisecond), log.String())
	return f, log.String()
}

func TestChaosV1(t *testing.T) {
	t.Parallel()
	f, log := runChaos(t, env.VariantV1)
	if f.Saved != 10 || f.Received != 8 || !slices.Equal(f.Lost, []int{7, 8}) || f.DuplicatesSkipped != 0 || f.Unsent != 0 {
		t.Errorf("v1 figures = %+v; want saved 10, received 8, lost [7 8], 0 duplicates, 0 unsent", *f)
	}
	if err := Expected(env.VariantV1, f); err != nil {
		t.Error(err)
	}
	// The last two come from the app's typed events (chat.EventV1AddFailed,
	// chat.EventV1Lost), not from log text.
	for _, want := range []string{"deploy:    workers stopped", "redis:     down", "deploy:    consumers stopped", "workers:   msg 10 shown",
		"not queued, kept in memory", "stopping with 2 queue add(s) still in memory"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q", want)
		}
	}
}

func TestChaosV2(t *testing.T) {
	t.Parallel()
	f, log := runChaos(t, env.VariantV2)
	if f.Saved != 10 || f.Received != 10 || len(f.Lost) != 0 || f.DuplicatesSkipped != 1 || f.Unsent != 0 || f.DuplicatesShown != 0 {
		t.Errorf("v2 figures = %+v; want saved 10, received 10, lost none, 1 duplicate, 0 unsent, nothing shown twice", *f)
	}
	if err := Expected(env.VariantV2, f); err != nil {
		t.Error(err)
	}
	if len(f.OrderViolations) > 0 {
		t.Errorf("order violations: %v", f.OrderViolations)
	}
	for _, want := range []string{"workers:   crashed after recording msg 2", "workers:   msg 2 again, already in inbox, skipped", "relay:     ", "redis:     up"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q", want)
		}
	}
}

// With the queue on NATS JetStream the write-up's outcome is the same: v1
// loses msgs 7 and 8 (held in the API's memory while nats-server was
// down, then redeployed), v2 loses none and skips the crash's duplicate.
func TestChaosOnNATS(t *testing.T) {
	t.Parallel()
	for _, variant := range []string{env.VariantV1, env.VariantV2} {
		t.Run(variant, func(t *testing.T) {
			t.Parallel()
			f, log := runChaosOn(t, variant, env.BrokerNATS)
			if err := Expected(variant, f); err != nil {
				t.Error(err)
			}
			if f.Saved != 10 || f.DuplicatesShown != 0 || len(f.OrderViolations) > 0 {
				t.Errorf("%s figures = %+v; want 10 saved, nothing shown twice, in order", variant, *f)
			}
			if !strings.Contains(log, "nats:      down") || !strings.Contains(log, "nats:      up") {
				t.Errorf("log lacks the nats-server's outage")
			}
		})
	}
}

// TestMain builds the outboxchat binary once: the experiment starts it as
// the services' processes.
func TestMain(m *testing.M) { labtest.Main(m, "lab-chaos-test-") }
