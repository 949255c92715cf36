package labcmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/outboxchat/outboxchat/cmd/outboxchat/internal/cliflag"
	"github.com/outboxchat/outboxchat/lab/chaos"
	"github.com/outboxchat/outboxchat/lab/env"
	"github.com/outboxchat/outboxchat/lab/latency"
)

// Demo runs `lab demo`: chaos v1, chaos v2, then the latency table
// (one run). It returns an error unless v1 lost exactly msgs 7 and 8, v2
// lost none, skipped exactly one duplicate and left nothing unsent, and
// the latency runs lost nothing.
func Demo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("lab demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	broker := brokerFlag(fs)
	if err := cliflag.Parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("lab demo: unexpected arguments %q", fs.Args())
	}
	var failed []error
	for i, v := range []string{env.VariantV1, env.VariantV2} {
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		fmt.Fprintf(stdout, "== chaos %s ==\n", v)
		f, err := chaos.Run(ctx, chaos.Options{Variant: v, Log: stdout, Progress: stderr, Broker: *broker})
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout)
		f.WriteSummary(stdout)
		if err := chaos.Expected(v, f); err != nil {
			fmt.Fprintf(stdout, "UNEXPECTED: %v\n", err)
			failed = append(failed, err)
		} else {
			fmt.Fprintf(stdout, "as expected\n")
		}
	}
	fmt.Fprintln(stdout)
	if *broker == env.BrokerNATS {
		// lab latency measures the Redis Streams pipeline only.
		fmt.Fprintln(stdout, "(the latency step runs on Redis Streams: lab latency has no --broker)")
	}
	if err := demoLatency(ctx, stdout, stderr); err != nil {
		failed = append(failed, err)
	}
	if len(failed) > 0 {
		return fmt.Errorf("lab demo: %w", errors.Join(failed...))
	}
	return nil
}

// demoLatency is `lab demo`'s latency step: every default variant, one run
// of the default messages and interval. Losing a message is unexpected.
func demoLatency(ctx context.Context, stdout, stderr io.Writer) error {
	fmt.Fprintln(stdout, "== latency ==")
	rep, err := latency.Measure(ctx, latency.Options{Runs: 1, Progress: stderr})
	if err != nil {
		return err
	}
	if err := writeLatency(rep, false, latency.DefaultPlotPath, stdout, stderr); err != nil {
		return err
	}
	var errs []error
	for _, v := range rep.Variants {
		if n := v.Lost(); n > 0 {
			errs = append(errs, fmt.Errorf("latency %s: %d message(s) lost", v.Variant, n))
		}
	}
	if len(errs) > 0 {
		fmt.Fprintf(stdout, "UNEXPECTED: %v\n", errors.Join(errs...))
		return errors.Join(errs...)
	}
	fmt.Fprintln(stdout, "as expected (nothing lost)")
	return nil
}
