package labcmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/outboxchat/outboxchat/cmd/outboxchat/internal/cliflag"
	"github.com/outboxchat/outboxchat/lab/env"
	"github.com/outboxchat/outboxchat/lab/latency"
)

// Latency runs `lab latency`.
func Latency(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("lab latency", flag.ContinueOnError)
	fs.SetOutput(stderr)
	variants := fs.String("variants", strings.Join(latency.DefaultVariants, ","), "comma-separated variants: v1, v2, v2-intx, v2-poll; edit and read time an edit and a read mark on v2")
	messages := fs.Int("messages", latency.DefaultMessages, "messages per run")
	interval := fs.Duration("interval", latency.DefaultInterval, "pause between two sends")
	runs := fs.Int("runs", latency.DefaultRuns, "runs per variant")
	asJSON := fs.Bool("json", false, "print one JSON object per variant per line (variant, runs, p50_ms, p95_ms, p99_ms, max_ms, n); floors and plot path go to stderr")
	plotPath := fs.String("plot", latency.DefaultPlotPath, `PNG of the latency CDF per variant ("none" = no plot)`)
	durable := fs.Bool("durable", false, "servers as production runs them: Postgres fsync=on and synchronous_commit=on, Redis appendonly yes with appendfsync everysec (default: the fast mode, Postgres fsync=off)")
	instances := fs.Int("instances", 1, "API+worker processes per service: sends go to the consumers instances in turn, the watcher is on the last workers instance")
	if err := cliflag.Parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("lab latency: unexpected arguments %q", fs.Args())
	}
	if *messages <= 0 || *runs <= 0 || *interval <= 0 || *instances <= 0 {
		return errors.New("lab latency: --messages, --runs, --interval and --instances must be positive")
	}
	vs := cliflag.List(*variants)
	if len(vs) == 0 {
		return errors.New("lab latency: --variants is empty")
	}
	rep, err := latency.Measure(ctx, latency.Options{Variants: vs, Messages: *messages, Interval: *interval, Runs: *runs, Progress: stderr, Durable: *durable, Instances: *instances})
	if err != nil {
		return err
	}
	return writeLatency(rep, *asJSON, *plotPath, stdout, stderr)
}

// writeLatency prints rep (table or JSON lines) and draws the plot.
func writeLatency(rep *latency.Report, asJSON bool, plotPath string, stdout, stderr io.Writer) error {
	if asJSON {
		if err := rep.WriteJSON(stdout); err != nil {
			return err
		}
		// The JSON lines keep DESIGN.md's fields alone; the servers' mode
		// goes with the floors.
		fmt.Fprintf(stderr, "servers: %s\n", env.ServerMode(rep.Durable))
		if rep.Floors != nil {
			rep.Floors.Write(stderr, rep.V2P50())
		}
	} else {
		rep.WriteTable(stdout)
	}
	if plotPath == "none" {
		return nil
	}
	path, err := latency.WritePlot(plotPath, rep)
	if err != nil {
		return err
	}
	out := stdout
	if asJSON {
		out = stderr
	}
	fmt.Fprintf(out, "\nplot: %s\n", path)
	return nil
}
