package labcmd

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/outboxchat/outboxchat/cmd/outboxchat/internal/cliflag"
	"github.com/outboxchat/outboxchat/lab/probe"
	"github.com/outboxchat/outboxchat/lab/torture"
)

// Torture runs `lab torture`.
func Torture(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("lab torture", flag.ContinueOnError)
	fs.SetOutput(stderr)
	schedules := fs.Int("schedules", torture.DefaultSchedules, "how many random fault schedules to run")
	seed := fs.Uint64("seed", 1, "seed of the schedules' draw (a failure prints it)")
	only := fs.Int("schedule", 0, "run only schedule K of --seed (a replay)")
	dur := fs.Duration("duration", torture.DefaultDuration, "load-and-fault phase of each schedule")
	drain := fs.Duration("drain-bound", torture.DefaultDrainBound, "the drain must finish within this long")
	drop := fs.String("drop", "", "comma-separated fault indexes to leave out (the shrinker prints them)")
	shrink := fs.Bool("shrink", false, "re-run a failing schedule without one fault at a time, keeping the drops under which it still fails")
	dir := fs.String("dir", "", "keep the process logs here (DIR/s<K>/<process>.log)")
	asJSON := fs.Bool("json", false, "print one JSON object (schedules, failed, lost, duplicates_shown, order_violations, max_drain_s, failures, …)")
	verbose := fs.Bool("v", false, "print the fault events to stderr")
	partitions := fs.Int("partitions", 1, "every service process's --partitions; the checker reads every partition's stream and outbox (not drawn: a schedule is the same whatever it is)")
	broker := brokerFlag(fs)
	cluster := fs.Bool("redis-cluster", false, "run every schedule on a Redis Cluster of 3 masters and 3 replicas and draw cluster faults too: a master killed with its replica held back and the replica promoted, a queue's slot moved key by key under load, a node paused")
	if err := cliflag.Parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("lab torture: unexpected arguments %q", fs.Args())
	}
	if *schedules < 1 {
		return cliflag.Usagef(fs, "lab torture: --schedules %d: want 1 or more", *schedules)
	}
	opts := torture.Options{Schedules: *schedules, Seed: *seed, Only: *only, Duration: *dur, DrainBound: *drain,
		Shrink: *shrink, Progress: stderr, Dir: *dir, RedisCluster: *cluster, Partitions: *partitions, Broker: *broker}
	if *verbose {
		opts.Log = stderr
	}
	if *drop != "" {
		for _, s := range strings.Split(*drop, ",") {
			i, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || i < 0 {
				return fmt.Errorf("lab torture: --drop %q: want fault indexes", *drop)
			}
			opts.Drop = append(opts.Drop, i)
		}
	}
	res, err := torture.Run(ctx, opts)
	if res != nil {
		if *asJSON {
			_ = json.NewEncoder(stdout).Encode(res)
		} else {
			fmt.Fprintf(stdout, "schedules: %d   failed: %d   sent: %d   lost: %d   shown twice: %d   order violations: %d   max drain: %.1fs\n",
				res.Schedules, res.Failed, res.Sent, res.Lost, res.DuplicatesShown, res.OrderViolations, res.MaxDrainS)
			for _, f := range res.Failures {
				fmt.Fprintf(stdout, "failed: --seed %d --schedule %d: %s\n", f.Seed, f.Schedule, strings.Join(f.Problems, "; "))
			}
		}
	}
	if err != nil {
		return err
	}
	if res.Failed > 0 {
		return fmt.Errorf("%w: lab torture: %d of %d schedules failed", probe.ErrInvariant, res.Failed, res.Schedules)
	}
	return nil
}
