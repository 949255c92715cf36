package inbox

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestRetryDelay(t *testing.T) {
	t.Parallel()
	const ms = time.Millisecond
	cases := []struct {
		base, limit time.Duration
		failures    int
		want        time.Duration
	}{
		{100 * ms, 2 * time.Second, 0, 100 * ms},
		{100 * ms, 2 * time.Second, 1, 200 * ms},
		{100 * ms, 2 * time.Second, 4, 1600 * ms},
		{100 * ms, 2 * time.Second, 5, 2 * time.Second},
		{100 * ms, 2 * time.Second, 1000, 2 * time.Second}, // no overflow
		{3 * time.Second, 3 * time.Second, 0, 3 * time.Second},
		{3 * time.Second, 3 * time.Second, 7, 3 * time.Second},
		{time.Duration(1<<62 - 1), time.Duration(1<<63 - 1), 64, time.Duration(1<<63 - 1)},
	}
	for _, tc := range cases {
		if got := retryDelay(tc.base, tc.limit, tc.failures); got != tc.want {
			t.Errorf("retryDelay(%v, %v, %d) = %v, want %v", tc.base, tc.limit, tc.failures, got, tc.want)
		}
	}
}

func TestIsPermanent(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return &pgconn.PgError{Code: code, Message: "x"} }
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"malformed", fmt.Errorf("decoding: %w", ErrMalformed), true},
		{"check violation", pg("23514"), true},
		{"unique violation wrapped", fmt.Errorf("inserting: %w", pg("23505")), true},
		{"invalid text representation", pg("22P02"), true},
		{"numeric out of range", pg("22003"), true},
		{"serialization failure", pg("40001"), false},
		{"deadlock", pg("40P01"), false},
		{"admin shutdown", pg("57P01"), false},
		{"in failed tx", pg("25P02"), false},
		{"undefined table", pg("42P01"), false},
		{"context", context.DeadlineExceeded, false},
		{"plain", errors.New("connection refused"), false},
	}
	for _, tc := range cases {
		if got := IsPermanent(tc.err); got != tc.want {
			t.Errorf("%s: IsPermanent(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}
