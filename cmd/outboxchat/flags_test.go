package main

import (
	"bytes"
	"errors"
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
