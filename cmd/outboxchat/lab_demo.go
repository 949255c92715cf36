package lab

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
)

// demoExtras are run by `lab demo` after chaos v1 and v2, in order (the
// latency table registers itself here from its own file's init when it
// exists). Each prints its own output and returns an error for results that
// are not the expected ones.
//
// HOOK for `lab latency`: append a func from an init in that file.
var demoExtras []func(ctx context.Context, stdout, stderr io.Writer) error

// runDemo runs `lab demo`: chaos v1, chaos v2, then demoExtras. It returns
// an error unless v1 lost exactly msgs 7 and 8 and v2 lost none, skipped
// exactly one duplicate and left nothing unsent.
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("lab demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	var failed []error
	for i, v := range []string{VariantV1, VariantV2} {
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		fmt.Fprintf(stdout, "== chaos %s ==\n", v)
		f, err := Chaos(ctx, ChaosOptions{Variant: v, Log: stdout, Progress: stderr})
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout)
		f.WriteSummary(stdout)
		if err := chaosExpected(v, f); err != nil {
			fmt.Fprintf(stdout, "UNEXPECTED: %v\n", err)
			failed = append(failed, err)
		} else {
			fmt.Fprintf(stdout, "as expected\n")
		}
	}
	for _, f := range demoExtras {
		fmt.Fprintln(stdout)
		if err := f(ctx, stdout, stderr); err != nil {
			failed = append(failed, err)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("lab demo: %w", errors.Join(failed...))
	}
	return nil
}
