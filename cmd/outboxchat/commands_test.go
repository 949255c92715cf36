package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/outboxchat/outboxchat/cmd/outboxchat/internal/labcmd"
)

// `outboxchat -h` lists every command, one line each, with what it does
// starting in one column for all of them.
func TestUsageIsOneAlignedTable(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if err := run(t.Context(), []string{"-h"}, &stdout, &stderr); err != nil {
		t.Fatalf("outboxchat -h: %v", err)
	}
	_, table, ok := strings.Cut(stdout.String(), "commands:\n")
	if !ok {
		t.Fatalf("outboxchat -h: no commands: line:\n%s", stdout.String())
	}
	listed := map[string]bool{}
	column := -1
	for _, line := range strings.Split(strings.TrimRight(table, "\n"), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		listed[name] = true
		rest := strings.TrimPrefix(line, "  "+name)
		c := len(line) - len(strings.TrimLeft(rest, " "))
		if column == -1 {
			column = c
		}
		if c != column || !strings.HasPrefix(line, "  "+name+" ") {
			t.Errorf("outboxchat -h: %q: what it does starts at column %d, want %d (as the first line's):\n%s", line, c, column, table)
		}
	}
	for _, c := range commands {
		if name := strings.Fields(c.name)[0]; !listed[name] {
			t.Errorf("outboxchat -h does not list %s:\n%s", name, table)
		}
	}
}

// `outboxchat lab -h` names every flag of each lab command on that
// command's lines, so that the overview does not drift from the flags.
func TestLabUsageNamesEveryFlag(t *testing.T) {
	blocks := map[string]string{} // command → its lines of the usage
	name := ""
	for _, line := range strings.Split(labcmd.Usage, "\n") {
		switch {
		case strings.HasPrefix(line, "  ") && !strings.HasPrefix(line, "   "):
			name, _, _ = strings.Cut(strings.TrimSpace(line), " ")
			blocks[name] += line + "\n"
		case strings.HasPrefix(line, "          ") && name != "":
			blocks[name] += line + "\n"
		}
	}
	for _, c := range commands {
		cmd, ok := strings.CutPrefix(c.name, "lab ")
		if !ok {
			continue
		}
		var stdout, stderr bytes.Buffer
		_ = run(t.Context(), []string{"lab", cmd, "-h"}, &stdout, &stderr)
		for _, line := range strings.Split(stderr.String(), "\n") {
			rest, ok := strings.CutPrefix(line, "  -")
			if !ok {
				continue
			}
			flagName := strings.Fields(rest)[0]
			if !strings.Contains(blocks[cmd], "--"+flagName) && !strings.Contains(blocks[cmd], "-"+flagName+"]") {
				t.Errorf("outboxchat lab -h: %s's lines do not name --%s:\n%s", cmd, flagName, blocks[cmd])
			}
		}
	}
}
