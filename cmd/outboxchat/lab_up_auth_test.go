package main

import (
	"strings"
	"testing"

	"github.com/outboxchat/outboxchat/lab/probe"
)

// TestUpPrintsTokenAndAuthIsOn runs `lab up` and checks its contract: the
// token line, the page URLs carrying the token in the fragment, and
// services that refuse requests without it and accept them with it.
func TestUpPrintsTokenAndAuthIsOn(t *testing.T) {
	t.Parallel()
	lines := startUp(t, "workers page").lines
	tok := lines["token"]
	if strings.Count(tok, ".") != 2 {
		t.Fatalf("no token line: %q", lines)
	}
	for _, k := range []string{"consumers", "workers"} {
		if want := lines[k] + "/?chat_id=1#token=" + tok; lines[k+" page"] != want {
			t.Errorf("%s page: %q, want %q", k, lines[k+" page"], want)
		}
	}
	ctx := t.Context()
	if _, err := probe.NewSender("").Send(ctx, lines["consumers"], 1, "hi"); err == nil || !strings.HasPrefix(err.Error(), "401 ") {
		t.Errorf("without the token: %v, want 401", err)
	}
	if _, err := probe.NewSender(tok).Send(ctx, lines["consumers"], 1, "hi"); err != nil {
		t.Errorf("with the token: %v, want 201", err)
	}
}
