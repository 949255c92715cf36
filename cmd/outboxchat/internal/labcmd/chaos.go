package labcmd

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"

	"github.com/outboxchat/outboxchat/cmd/outboxchat/internal/cliflag"
	"github.com/outboxchat/outboxchat/lab/chaos"
	"github.com/outboxchat/outboxchat/lab/env"
	"github.com/outboxchat/outboxchat/lab/scenario"
)

// Chaos runs `lab chaos`: the write-up's experiment, or with
// --scenario a named scenario (as `lab scenario NAME`), or --list.
func Chaos(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("lab chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	variant := fs.String("variant", env.VariantV2, "v1 (naive dual write) or v2 (transactional outbox)")
	asJSON := fs.Bool("json", false, "print one JSON object (saved, received, duplicates_skipped, lost, unsent); the event log goes to stderr")
	name := fs.String("scenario", "", "run a named scenario instead (see --list)")
	list := fs.Bool("list", false, "list the named scenarios")
	broker := brokerFlag(fs)
	if err := cliflag.Parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("lab chaos: unexpected arguments %q", fs.Args())
	}
	if *list {
		listScenarios(stdout)
		return nil
	}
	if *name != "" {
		return runScenario(ctx, *name, scenario.Options{}, *asJSON, stdout, stderr)
	}
	f, err := chaos.Run(ctx, chaos.Options{Variant: *variant, Broker: *broker, Log: eventLogTo(*asJSON, stdout, stderr), Progress: stderr})
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(f)
	}
	fmt.Fprintln(stdout)
	f.WriteSummary(stdout)
	return nil
}

// eventLogTo is where an experiment's event log goes: stdout, or stderr
// when stdout carries the JSON result.
func eventLogTo(asJSON bool, stdout, stderr io.Writer) io.Writer {
	if asJSON {
		return stderr
	}
	return stdout
}
