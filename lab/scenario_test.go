package lab

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// TestScenarios runs every named scenario; each must keep the invariants
// (nothing lost, nothing shown twice, order kept, nothing left unsent).
func TestScenarios(t *testing.T) {
	for _, name := range ScenarioNames() {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			var log bytes.Buffer
			f, err := RunScenario(ctx, name, &log, nil)
			t.Logf("log:\n%s", log.String())
			if err != nil {
				t.Fatal(err)
			}
			if f.Saved == 0 || f.Received != f.Saved {
				t.Errorf("figures %+v: want every saved message received", *f)
			}
		})
	}
}
