package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/outboxchat/outboxchat/internal/pgproc"
)

// command is one `outboxchat` command: its name ("serve"; a lab command is
// "lab NAME") and what runs it with the arguments after the name. run
// returns flag.ErrHelp for -h and an error for bad flags and failures.
type command struct {
	name string
	run  func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

// commands is every command of the binary, each in a file of its own named
// after it (lab_up.go runs "lab up"). There is no other registration.
var commands = []command{
	{"serve", runServe},
	{"migrate", runMigrate},
	{"token", runToken},
	{"status", runStatus},
	{"deadletters", runDeadletters},
	{"outbox", runOutbox},
	{"prune", runPrune},
	{"lab up", runLabUp},
	{"lab chaos", runLabChaos},
	{"lab scenario", runLabScenario},
	{"lab latency", runLabLatency},
	{"lab bench", runLabBench},
	{"lab demo", runLabDemo},
	{"lab torture", runLabTorture},
}

// lookup returns the command named name, nil if none.
func lookup(name string) *command {
	for i := range commands {
		if commands[i].name == name {
			return &commands[i]
		}
	}
	return nil
}

const usage = `usage: outboxchat <command> [flags]

commands:
  serve    run a service (consumers or workers)
  migrate  create the service's role and schema, apply migrations
  token    mint a development JWT (HS256) for a user, services and chats
  lab      up | chaos | latency | bench | demo: private servers, fault experiments, measurements
  status       both services on one screen; exits 1 when something needs a person
  deadletters  list | show | replay | drop the dead letters
  outbox       parked | retry: the outbox rows parked after failed publishes
  prune        --service S --older-than D: delete history older than D once, print the counts
`

const labUsage = `usage: outboxchat lab <command> [flags]

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

// run runs `outboxchat <args>`: the command named by args[0] (and, for
// lab, args[1]) with the rest. The report goes to stdout, progress and
// usage to stderr; -h prints the usage to stdout.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "lab" {
		// Every private Postgres of a lab run starts from one template
		// cluster made by the first; remove it when the command ends.
		defer func() { _ = pgproc.RemoveTemplate() }()
		return dispatch(ctx, group{prefix: "lab ", usage: labUsage, help: flag.ErrHelp}, args[1:], stdout, stderr)
	}
	return dispatch(ctx, group{usage: usage}, args, stdout, stderr)
}

// group is a level of the command names: the top one (prefix "") or the
// lab's ("lab "), with its usage and what asking it for help returns (nil
// at the top; flag.ErrHelp for lab, as for a command's -h).
type group struct {
	prefix, usage string
	help          error
}

// dispatch runs the command of g named by args[0] with the rest. No name
// or an unknown one prints g's usage to stderr and is an error; -h prints
// it to stdout.
func dispatch(ctx context.Context, g group, args []string, stdout, stderr io.Writer) error {
	errPrefix := strings.TrimSuffix(g.prefix, " ")
	if errPrefix != "" {
		errPrefix += ": "
	}
	if len(args) == 0 {
		fmt.Fprint(stderr, g.usage)
		return errors.New(errPrefix + "no command")
	}
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, g.usage)
		return g.help
	}
	if c := lookup(g.prefix + args[0]); c != nil && !strings.Contains(args[0], " ") {
		return c.run(ctx, args[1:], stdout, stderr)
	}
	fmt.Fprint(stderr, g.usage)
	return fmt.Errorf("%sunknown command %q", errPrefix, args[0])
}
