package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/outboxchat/outboxchat/cmd/outboxchat/internal/labcmd"
)

// command is one `outboxchat` command: its name ("serve"; a lab command is
// "lab NAME") and what runs it with the arguments after the name. run
// parses its flags with cliflag.Parse: it returns flag.ErrHelp for -h, a
// *cliflag.ParseError for bad flags (already printed, with a hint to run
// the command with -h), and an error for other failures.
type command struct {
	name string
	run  func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

// commands is every command of the binary, each in a file of its own named
// after it (internal/labcmd/up.go runs "lab up"). There is no other
// registration.
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
	{"lab up", labcmd.Up},
	{"lab chaos", labcmd.Chaos},
	{"lab scenario", labcmd.Scenario},
	{"lab latency", labcmd.Latency},
	{"lab bench", labcmd.Bench},
	{"lab demo", labcmd.Demo},
	{"lab torture", labcmd.Torture},
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

// usage is the text of `outboxchat -h`: the commands, one aligned line each.
var usage = commandList("usage: outboxchat <command> [flags]\n\ncommands:\n", [][2]string{
	{"serve", "run a service (consumers or workers)"},
	{"migrate", "create the service's role and schema, apply migrations"},
	{"token", "mint a development JWT (HS256) for a user, services and chats"},
	{"revoke", "--user U | --token-id JTI: refuse a user's tokens issued until now, or one token"},
	{"lab", "up | demo | chaos | scenario | torture | latency | bench: private servers, fault experiments, measurements"},
	{"status", "both services on one screen; exits 1 when something needs a person"},
	{"trace", "--message-id ID | --chat N --seq S: one message's way across both services"},
	{"deadletters", "list | show | replay | drop the dead letters"},
	{"outbox", "parked | retry: the outbox rows parked after failed publishes"},
	{"prune", "--service S --older-than D: delete history older than D once, print the counts"},
})

// commandList returns header followed by one line per row, "  NAME  WHAT",
// the WHATs aligned in one column.
func commandList(header string, rows [][2]string) string {
	var b strings.Builder
	b.WriteString(header)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintf(tw, "  %s\t%s\n", r[0], r[1])
	}
	tw.Flush()
	return b.String()
}
