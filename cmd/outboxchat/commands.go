package lab

import (
	"github.com/outboxchat/outboxchat/internal/pgproc"

	"context"
	"errors"
	"flag"
	"fmt"
	"io"
)

const usage = `usage: outboxchat lab <command> [flags]

commands:
  up      start private Postgres and Redis and both services; print their URLs; Ctrl-C stops all:
          [--consumers-addr PORT] [--workers-addr PORT] [--keep-logs] [--variant v2] [--tls]
  chaos   the write-up's fault experiment: --variant v1|v2 [--json]; or --scenario NAME; --list
  scenario NAME [--json] [--redrive-after D]: a named fault scenario (redis-flush, stream-entry-deleted, …); --list
  latency the write-up's latency table: [--variants v1,v2,v2-intx,v2-poll] [--messages 100] [--interval 100ms]
          [--runs 3] [--json] [--plot lab-output/latency-cdf.png]; plus the floors (commit, PING, NOTIFY)
  bench   sustained load: [--senders 16] [--chats 100] [--messages 20000] [--variant v2] [--hold-snapshot] [--pgbouncer] [--json]
  demo    chaos v1, then chaos v2, then the latency table (1 run); fails unless results are as expected
  torture random fault schedules checked by an independent checker: [--schedules 10] [--seed 1]
          [--schedule K] [--duration 20s] [--drain-bound 60s] [--drop I,J] [--shrink] [--dir DIR] [-v] [--json]
`

// Run runs `outboxchat lab <args>` (up, chaos, demo, …). The report goes to
// stdout, progress to stderr. It returns flag.ErrHelp for -h, and an error
// for unknown commands, failed setups and (demo, scenarios) unexpected
// results. Cancelling ctx (Ctrl-C) stops the run and removes every private
// server and process it started.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	// Every private Postgres of the run starts from one template cluster
	// made by the first; remove it when the command ends.
	defer func() { _ = pgproc.RemoveTemplate() }()
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("lab: no command")
	}
	switch args[0] {
	case "up":
		return runUp(ctx, args[1:], stdout, stderr)
	case "chaos":
		return runChaosCmd(ctx, args[1:], stdout, stderr)
	case "demo":
		return runDemo(ctx, args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return flag.ErrHelp
	}
	if f, ok := extraCommands[args[0]]; ok {
		return f(ctx, args[1:], stdout, stderr)
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("lab: unknown command %q", args[0])
}

// extraCommands are lab subcommands added by other files of this package
// (e.g. latency, bench) through an init function: name → runner.
var extraCommands = map[string]func(ctx context.Context, args []string, stdout, stderr io.Writer) error{}
