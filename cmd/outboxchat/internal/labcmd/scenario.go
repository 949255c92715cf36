package labcmd

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/cmd/outboxchat/internal/cliflag"
	"github.com/outboxchat/outboxchat/lab/scenario"
)

// Scenario runs `lab scenario NAME [--json] [--redrive-after D]
// [--partitions N] [--broker redis|nats]`, or --list.
func Scenario(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("lab scenario", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: outboxchat lab scenario NAME [--json] [--redrive-after D] [--partitions N] [--broker redis|nats]  |  --list")
		fs.PrintDefaults()
	}
	asJSON := fs.Bool("json", false, "print one JSON object (scenario, sent, received, lost, duplicates_shown, order_violations, redriven, ok, …); the event log goes to stderr")
	redrive := fs.String("redrive-after", "", "pass --redrive-after to the services (0 = re-drive off: shows what Redis lost; default: the services' own, twice the lab's 5 s lock duration)")
	partitions := fs.Int("partitions", 1, "both services' --partitions: the scenario's chat travels in its partition's queue, which the faults aim at")
	broker := fs.String("broker", "", "the queue between the services: redis or nats (default: the scenario's own, nats for nats-*, else redis); "+strings.Join(scenario.AnyBroker(), ", ")+" run on either")
	list := fs.Bool("list", false, "list the named scenarios")
	// NAME may come before or after the flags.
	var name string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	if err := cliflag.Parse(fs, args); err != nil {
		return err
	}
	if *list {
		listScenarios(stdout)
		return nil
	}
	if name == "" && fs.NArg() == 1 {
		name = fs.Arg(0)
	} else if fs.NArg() > 0 {
		return fmt.Errorf("lab scenario: unexpected arguments %q", fs.Args())
	}
	if name == "" {
		return fmt.Errorf("lab scenario: name a scenario (one of %s)", strings.Join(scenario.Names(), ", "))
	}
	if err := chat.CheckPartitions(*partitions); err != nil {
		return fmt.Errorf("lab scenario: --partitions: %w", err)
	}
	so := scenario.Options{Partitions: *partitions, Broker: *broker}
	if *redrive != "" {
		so.ExtraArgs = []string{"--redrive-after", *redrive}
	}
	return runScenario(ctx, name, so, *asJSON, stdout, stderr)
}

// listScenarios prints one line per scenario: its name and what it does.
func listScenarios(w io.Writer) {
	for _, n := range scenario.Names() {
		fmt.Fprintf(w, "%-28s %s\n", n, scenario.Doc(n))
	}
}

// runScenario runs scenario name and prints its figures (or the JSON
// object), then, when the invariants held, says so on the event log.
func runScenario(ctx context.Context, name string, so scenario.Options, asJSON bool, stdout, stderr io.Writer) error {
	logW := eventLogTo(asJSON, stdout, stderr)
	so.Log, so.Progress = logW, stderr
	f, m, err := scenario.RunMeasured(ctx, name, so)
	if f != nil {
		if asJSON {
			r := scenario.NewResult(name, f, err)
			r.Measures = m
			_ = json.NewEncoder(stdout).Encode(r)
		} else {
			fmt.Fprintln(stdout)
			f.WriteSummary(stdout)
			fmt.Fprintf(stdout, "shown twice: %d   order violations: %d   re-driven: %d\n", f.DuplicatesShown, len(f.OrderViolations), f.Redriven)
			if m.MoveMs > 0 {
				fmt.Fprintf(stdout, "slot move: %d ms   longest gap between messages shown: %d ms during the move, %d ms before\n", m.MoveMs, m.MaxGapDuringMs, m.MaxGapBeforeMs)
			}
		}
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(logW, "invariants hold: nothing lost, nothing shown twice, order kept")
	return nil
}
