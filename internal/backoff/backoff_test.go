package backoff

import (
	"context"
	"testing"
	"time"
)

func TestDelay(t *testing.T) {
	t.Parallel()
	const ms = time.Millisecond
	cases := []struct {
		base, limit time.Duration
		n           int
		want        time.Duration
	}{
		{100 * ms, 2 * time.Second, 0, 100 * ms},
		{100 * ms, 2 * time.Second, 1, 200 * ms},
		{100 * ms, 2 * time.Second, 4, 1600 * ms},
		{100 * ms, 2 * time.Second, 5, 2 * time.Second},
		{100 * ms, 2 * time.Second, 1000, 2 * time.Second}, // no overflow
		{3 * time.Second, 3 * time.Second, 0, 3 * time.Second},
		{3 * time.Second, 3 * time.Second, 7, 3 * time.Second},
		{5 * time.Second, time.Second, 0, time.Second},
		{time.Duration(1<<62 - 1), time.Duration(1<<63 - 1), 64, time.Duration(1<<63 - 1)},
	}
	for _, tc := range cases {
		if got := Delay(tc.base, tc.limit, tc.n); got != tc.want {
			t.Errorf("Delay(%v, %v, %d) = %v, want %v", tc.base, tc.limit, tc.n, got, tc.want)
		}
	}
}

func TestSleep(t *testing.T) {
	t.Parallel()
	if !Sleep(context.Background(), nil, time.Millisecond) {
		t.Error("Sleep without a stop = false")
	}
	stop := make(chan struct{})
	close(stop)
	if Sleep(context.Background(), stop, time.Hour) {
		t.Error("Sleep with a closed stop = true")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, nil, time.Hour) {
		t.Error("Sleep with an ended ctx = true")
	}
}
