package inbox

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

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
