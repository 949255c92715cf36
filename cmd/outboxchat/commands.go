package main

import (
	"context"
	"io"
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
	{"revoke", runRevoke},
	{"status", runStatus},
	{"trace", runTrace},
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
  revoke   --user U | --token-id JTI: refuse a user's tokens issued until now, or one token
  lab      up | demo | chaos | scenario | torture | latency | bench: private servers, fault experiments, measurements
  status       both services on one screen; exits 1 when something needs a person
  trace        --message-id ID | --chat N --seq S: one message's way across both services
  deadletters  list | show | replay | drop the dead letters
  outbox       parked | retry: the outbox rows parked after failed publishes
  prune        --service S --older-than D: delete history older than D once, print the counts
`

const labUsage = `usage: outboxchat lab <command> [flags]

commands:
  up      start private Postgres and Redis and both services; print their URLs; Ctrl-C stops all:
          [--consumers-addr PORT] [--workers-addr PORT] [--keep-logs] [--variant v2] [--tls] [--durable] [--instances N]
  chaos   the write-up's fault experiment: --variant v1|v2 [--json]; or --scenario NAME; --list
  scenario NAME [--json] [--redrive-after D]: a named fault scenario (redis-flush, stream-entry-deleted, …); --list
  latency the write-up's latency table: [--variants v1,v2,v2-intx,v2-poll] [--messages 100] [--interval 100ms]
          [--runs 3] [--instances 1] [--durable] [--json] [--plot lab-output/latency-cdf.png]; plus the floors (commit, PING, NOTIFY)
  bench   sustained load: [--senders 16] [--chats 100] [--messages 20000] [--variant v2] [--hold-snapshot] [--pgbouncer] [--durable] [--history-retention D] [--profile-dir DIR] [--counts] [--partitions N] [--redis-latency D] [--json]
  demo    chaos v1, then chaos v2, then the latency table (1 run); fails unless results are as expected
  torture random fault schedules checked by an independent checker: [--schedules 10] [--seed 1]
          [--schedule K] [--duration 20s] [--drain-bound 60s] [--drop I,J] [--shrink] [--dir DIR] [-v] [--json]
`
