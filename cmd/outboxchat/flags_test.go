package main

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/outboxchat/outboxchat/lab/process"
)

// Every command of the binary, run with a flag it does not define, prints
// the flag package's error once and a one-line hint to run it with -h (not
// the whole usage, which buries the error), and exits 2; a bad value of a
// defined flag too. -h and --help still print the whole usage and exit 0.
// The binary runs as a process of its own, so what main prints after run
// returns is checked with the rest.
func TestBadFlagIsReportedOnce(t *testing.T) {
	t.Parallel()
	// The commands whose flags come after an action.
	actions := map[string]string{"deadletters": "list", "outbox": "parked"}
	type badRun struct {
		args []string
		want string
	}
	var runs, helps []badRun
	for _, c := range commands {
		args := strings.Fields(c.name)
		if a, ok := actions[c.name]; ok {
			args = append(args, a)
		}
		hint := "run 'outboxchat " + strings.Join(args, " ") + " -h' for the flags"
		runs = append(runs, badRun{append(slices.Clip(args), "--bogus"), "flag provided but not defined: -bogus\n" + hint + "\n"})
		helps = append(helps, badRun{append(slices.Clip(args), "-h"), ""}, badRun{append(slices.Clip(args), "--help"), ""})
	}
	// A value its flag's type cannot parse: the error says what it wants.
	runs = append(runs,
		badRun{[]string{"lab", "latency", "--messages", "many"},
			`invalid value "many" for flag -messages: want an integer such as 100` + "\nrun 'outboxchat lab latency -h' for the flags\n"},
		badRun{[]string{"token", "--ttl", "soon"},
			`invalid value "soon" for flag -ttl: want a duration such as 1h0m0s (a number and a unit: ms, s, m, h)` + "\nrun 'outboxchat token -h' for the flags\n"},
		badRun{[]string{"prune", "--older-than", "30"},
			`invalid value "30" for flag -older-than: want a duration such as 5s (a number and a unit: ms, s, m, h)` + "\nrun 'outboxchat prune -h' for the flags\n"},
		badRun{[]string{"status", "--json=maybe"},
			`invalid boolean value "maybe" for -json: want true or false` + "\nrun 'outboxchat status -h' for the flags\n"})
	// A command line that parses but will not do: a required flag
	// missing, a value the command refuses.
	runs = append(runs,
		badRun{[]string{"token", "--user", "alice"},
			"token: --jwt-secret-file, --service and --chats are required\nrun 'outboxchat token -h' for the flags\n"},
		badRun{[]string{"token", "--jwt-secret-file", "/nonexistent", "--service", "consumers", "--user", "alice", "--chats", "one"},
			`token: chats: "one" is not a chat id` + "\nrun 'outboxchat token -h' for the flags\n"},
		badRun{[]string{"revoke", "--database-url", "postgres://127.0.0.1:1/x"},
			"revoke: give exactly one of --user and --token-id\nrun 'outboxchat revoke -h' for the flags\n"},
		badRun{[]string{"revoke", "--database-url", "postgres://127.0.0.1:1/x", "--user", "alice", "--service", "nobody"},
			`revoke: --service: chat: unknown service (want consumers or workers): "nobody"` + "\nrun 'outboxchat revoke -h' for the flags\n"})
	// The commands of one service name a missing or unknown --service
	// before they connect anywhere (the URLs here refuse connections);
	// serve checks --http's shape then too.
	noDB := "postgres://127.0.0.1:1/x"
	for _, c := range []struct{ name, extra string }{{"serve", ""}, {"migrate", ""}, {"prune", "--older-than 1h"}, {"outbox parked", ""}} {
		args := append(strings.Fields(c.name+" "+c.extra), "--database-url", noDB)
		hint := "\nrun 'outboxchat " + c.name + " -h' for the flags\n"
		runs = append(runs,
			badRun{args, c.name + ": --service is required: consumers or workers" + hint},
			badRun{append(slices.Clip(args), "--service", "nobody"), c.name + `: --service "nobody": want consumers or workers` + hint})
	}
	runs = append(runs,
		badRun{[]string{"trace", "--database-url", noDB, "--message-id", "nope"},
			`trace: --message-id "nope": want a message's id, a UUID such as 0190f1a2-7c3e-7abc-8def-0123456789ab` + "\nrun 'outboxchat trace -h' for the flags\n"},
		badRun{[]string{"lab", "up", "--partitions", "0"},
			"lab up: --partitions 0: want 1 to 256\nrun 'outboxchat lab up -h' for the flags\n"},
		badRun{[]string{"lab", "up", "--tls", "--redis-cluster"},
			"lab up: --redis-cluster with --tls is not supported\nrun 'outboxchat lab up -h' for the flags\n"},
		badRun{[]string{"lab", "torture", "--schedules", "0"},
			"lab torture: --schedules 0: want 1 or more\nrun 'outboxchat lab torture -h' for the flags\n"},
		badRun{[]string{"lab", "bench", "--variant", "v3"},
			`lab bench: --variant "v3": want v1, v2, v2-poll or v2-intx` + "\nrun 'outboxchat lab bench -h' for the flags\n"},
		badRun{[]string{"serve", "--service", "consumers", "--database-url", noDB, "--redis-url", "redis://127.0.0.1:1/0", "--http", "8080"},
			`serve: --http "8080": want host:port, such as 127.0.0.1:8080` + "\nrun 'outboxchat serve -h' for the flags\n"})
	outboxchat := func(t *testing.T, args []string) (stdout, stderr string, exit int) {
		var out, errOut bytes.Buffer
		cmd := exec.CommandContext(t.Context(), process.Binary, args...)
		cmd.Stdout, cmd.Stderr = &out, &errOut
		// No flag's default from this machine's environment.
		cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
			return strings.HasPrefix(kv, "OUTBOXCHAT_") || strings.HasPrefix(kv, "DATABASE_URL=") || strings.HasPrefix(kv, "REDIS_URL=")
		})
		err := cmd.Run()
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			exit = ee.ExitCode()
		case err != nil:
			t.Fatalf("outboxchat %s: %v", strings.Join(args, " "), err)
		}
		return out.String(), errOut.String(), exit
	}
	for _, r := range runs {
		name := strings.Join(r.args, " ")
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			stdout, stderr, exit := outboxchat(t, r.args)
			if exit != 2 {
				t.Errorf("outboxchat %s: exit status %d, want 2", name, exit)
			}
			if stderr != r.want {
				t.Errorf("outboxchat %s: stderr\n%s\nwant just\n%s", name, stderr, r.want)
			}
			if stdout != "" {
				t.Errorf("outboxchat %s: stdout %q, want nothing", name, stdout)
			}
		})
	}
	// The commands with actions print their usage, which lists the
	// actions, for -h in place of an action.
	for c := range actions {
		helps = append(helps, badRun{[]string{c, "-h"}, "usage: outboxchat " + c + " <action>"},
			badRun{[]string{c, "--help"}, "usage: outboxchat " + c + " <action>"})
	}
	for _, r := range helps {
		name := strings.Join(r.args, " ")
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, stderr, exit := outboxchat(t, r.args)
			if exit != 0 {
				t.Errorf("outboxchat %s: exit status %d, want 0", name, exit)
			}
			if r.want != "" {
				if !strings.HasPrefix(stderr, r.want) {
					t.Errorf("outboxchat %s: stderr\n%s\nwant it to begin %q", name, stderr, r.want)
				}
				return
			}
			if !strings.Contains(stderr, "Usage of ") && !strings.Contains(stderr, "usage: ") || !strings.Contains(stderr, "\n  -") {
				t.Errorf("outboxchat %s: no usage with the flags in stderr:\n%s", name, stderr)
			}
		})
	}
}

// Every command's -h shows at most one default per flag, in words where
// the flag's usage gives one: no second "(default …)" from the flag
// package after a usage text that names an environment variable or a
// sentinel's meaning, no sentinel ("-1ns"), and no environment variable's
// value (a URL's password).
func TestHelpShowsOneDefaultPerFlag(t *testing.T) {
	const secret = "s3cret-from-env"
	for _, env := range []string{"DATABASE_URL", "LISTEN_DATABASE_URL", "REDIS_URL", "BROKER_URL", "OUTBOXCHAT_FAULT",
		"OUTBOXCHAT_JWT_SECRET_FILE", "OUTBOXCHAT_EVENT_KEY_FILE"} {
		t.Setenv(env, "redis://u:"+secret+"@h:1/0")
	}
	t.Setenv("OUTBOXCHAT_PARTITIONS", "7")
	actions := map[string]string{"deadletters": "list", "outbox": "parked"}
	for _, c := range commands {
		args := strings.Fields(c.name)
		if a, ok := actions[c.name]; ok {
			args = append(args, a)
		}
		name := strings.Join(args, " ")
		var stdout, stderr bytes.Buffer
		if err := run(t.Context(), append(args, "-h"), &stdout, &stderr); !errors.Is(err, flag.ErrHelp) {
			t.Errorf("outboxchat %s -h: %v, want flag.ErrHelp", name, err)
		}
		help := stdout.String() + stderr.String()
		for _, line := range strings.Split(help, "\n") {
			if strings.Contains(line, secret) || strings.Contains(line, "(default 7)") {
				t.Errorf("outboxchat %s -h shows an environment variable's value: %s", name, line)
			}
		}
		// One entry per flag: "  -name type\n    \tusage (default …)\n".
		for _, entry := range strings.Split(help, "\n  -")[1:] {
			if n := strings.Count(entry, "(default"); n > 1 || strings.Contains(entry, "-1ns") {
				t.Errorf("outboxchat %s -h: %d defaults in\n  -%s", name, n, entry)
			}
		}
	}
}

// A database that refuses connections is named as such, under the
// command's own name: not as a failed probe for a pooler, nor as serve's.
func TestUnreachableDatabaseIsNamed(t *testing.T) {
	t.Parallel()
	for c, more := range map[string][]string{"migrate": nil, "serve": {"--redis-url", "redis://127.0.0.1:1/0", "--insecure-no-auth"}} {
		t.Run(c, func(t *testing.T) {
			t.Parallel()
			var errOut bytes.Buffer
			args := append([]string{c, "--service", "consumers", "--database-url", "postgres://consumers@127.0.0.1:1/x?sslmode=disable"}, more...)
			cmd := exec.CommandContext(t.Context(), process.Binary, args...)
			cmd.Stderr = &errOut
			cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "OUTBOXCHAT_") })
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Fatalf("outboxchat %s: %v, want exit status 1", c, err)
			}
			last := strings.TrimSpace(errOut.String())
			if i := strings.LastIndex(last, "\noutboxchat: "); i >= 0 {
				last = last[i+1:] // serve logs before it fails
			}
			want := "outboxchat: " + c + ": connect to postgres: "
			if !strings.HasPrefix(last, want) || strings.Contains(last, "pooler") || (c != "serve" && strings.Contains(last, "serve")) {
				t.Errorf("outboxchat %s: error\n%s\nwant it to begin %q, naming no pooler probe", c, last, want)
			}
		})
	}
}

// go-redis's own lines ("redis: <date> pool.go:NNN: … failed to dial")
// stay out of an operator command's output: status reports the Redis it
// could not read itself.
func TestRedisClientLinesStayOut(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	cmd := exec.CommandContext(t.Context(), process.Binary, "status",
		"--database-url", "postgres://127.0.0.1:1/x?sslmode=disable", "--redis-url", "redis://127.0.0.1:1/0")
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "OUTBOXCHAT_") })
	_ = cmd.Run() // exit 1: something needs a person
	if !strings.Contains(out.String(), "NEEDS A PERSON") {
		t.Fatalf("status with nothing reachable:\n%s\nwant its NEEDS A PERSON report", out.String())
	}
	if strings.Contains(out.String(), "pool.go:") {
		t.Errorf("status output holds go-redis's own lines:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "redis 127.0.0.1:1: durability unknown (redisq: ") {
		t.Errorf("status output:\n%s\nwant the unread durability's reason in parentheses", out.String())
	}
}
