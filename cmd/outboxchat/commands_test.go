package main

import (
	"bytes"
	"strings"
	"testing"
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
