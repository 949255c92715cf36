package main

import (
	"bytes"
	"errors"
	"flag"
	"os/exec"
	"strings"
	"testing"

	"github.com/outboxchat/outboxchat/lab/process"
)

// Every command of the binary, run with a flag it does not define, prints
// the flag package's error once, with its usage, and exits 2; a bad value
// of a defined flag too. The binary runs as a process of its own, so what
// main prints after run returns is checked with the rest.
func TestBadFlagIsReportedOnce(t *testing.T) {
	t.Parallel()
	// The commands whose flags come after an action.
	actions := map[string]string{"deadletters": "list", "outbox": "parked"}
	type badRun struct {
		args []string
		want string
	}
	var runs []badRun
	for _, c := range commands {
		args := strings.Fields(c.name)
		if a, ok := actions[c.name]; ok {
			args = append(args, a)
		}
		runs = append(runs, badRun{append(args, "--bogus"), "flag provided but not defined: -bogus"})
	}
	runs = append(runs, badRun{[]string{"lab", "latency", "--messages", "many"}, `invalid value "many" for flag -messages`})
	for _, r := range runs {
		name := strings.Join(r.args, " ")
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			cmd := exec.CommandContext(t.Context(), process.Binary, r.args...)
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 2 {
				t.Errorf("outboxchat %s: %v, want exit status 2", name, err)
			}
			if n := strings.Count(stderr.String(), r.want); n != 1 {
				t.Errorf("outboxchat %s: %q %d times in stderr, want once:\n%s", name, r.want, n, stderr.String())
			}
			if !strings.Contains(stderr.String(), "Usage of ") && !strings.Contains(stderr.String(), "usage: ") {
				t.Errorf("outboxchat %s: no usage in stderr:\n%s", name, stderr.String())
			}
			if stdout.Len() != 0 {
				t.Errorf("outboxchat %s: stdout %q, want nothing", name, stdout.String())
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
