package perf

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/lab/env"
)

func TestBenchDefaults(t *testing.T) {
	o := benchDefaults(BenchOptions{Chats: 7})
	if o.Senders != DefaultBenchSenders || o.Chats != 7 || o.Messages != DefaultBenchMessages || o.Variant != env.VariantV2 ||
		o.SendTimeout != DefaultBenchSendTimeout || o.Drain != DefaultBenchDrain || o.ProgressEvery != time.Second {
		t.Fatalf("benchDefaults = %+v", o)
	}
}

// ExampleBench pushes 1,000 messages through the pipeline and prints the
// figures (it needs postgres and redis-server).
func ExampleBench() {
	res, err := Bench(context.Background(), BenchOptions{Senders: 4, Chats: 10, Messages: 1000})
	if err != nil {
		fmt.Println(err)
		return
	}
	res.WriteText(os.Stdout)
}

func TestWindowRates(t *testing.T) {
	start := time.Unix(1000, 0)
	at := func(ms int) time.Time { return start.Add(time.Duration(ms) * time.Millisecond) }
	for _, tc := range []struct {
		name string
		ts   []time.Time
		want []float64
	}{
		{"none", nil, []float64{}},
		{"two full windows and a short last one dropped", []time.Time{at(0), at(5000), at(9999), at(10000), at(10500)}, []float64{0.3}},
		{"partial last window counted over its length", []time.Time{at(1000), at(12000), at(15000)}, []float64{0.1, 0.4}},
		{"before start ignored", []time.Time{at(-5), at(3000), at(10000)}, []float64{0.1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := windowRates(start, tc.ts, 10*time.Second); !slices.Equal(got, tc.want) {
				t.Errorf("windowRates = %v, want %v", got, tc.want)
			}
		})
	}
}
