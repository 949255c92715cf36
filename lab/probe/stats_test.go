package probe

import (
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
			if got := Percentile(tc.s, tc.p); got != tc.want {
				t.Fatalf("Percentile(%v) = %v, want %v", tc.p, got, tc.want)
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
		if got := Median(tc.in); got != tc.want {
			t.Errorf("Median(%v) = %v, want %v", tc.in, got, tc.want)
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
		if got := FmtRange(tc.in); got != tc.want {
			t.Errorf("FmtRange(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
	if got := RoundMs(1234567 * time.Nanosecond); got != 1.235 {
		t.Errorf("roundMs = %v, want 1.235", got)
	}
}
