package main

import (
	"strings"
	"testing"

	"github.com/outboxchat/outboxchat/lab/env"
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
	// Each page's token is of a user of its own (env.PageUsers), good on
	// both services, so the two pages show who wrote what; the token line
	// is the consumers page's, so that what the README's curl sends with
	// it shows as that page's user.
	for _, k := range []string{"consumers", "workers"} {
		page, ok := strings.CutPrefix(lines[k+" page"], lines[k]+"/?chat_id=1#token=")
		if !ok || (page == tok) != (k == "consumers") {
			t.Fatalf("%s page: %q (token line %q), want %s/?chat_id=1#token=<its user's token>, the consumers page's the token line's",
				k, lines[k+" page"], tok, lines[k])
		}
		for _, base := range []string{lines["consumers"], lines["workers"]} {
			m, err := probe.NewSender(page).Send(t.Context(), base, 1, "from the "+k+" page")
			if err != nil || m.Author != env.PageUsers[k] {
				t.Errorf("send with the %s page's token to %s: author %q, %v; want %q", k, base, m.Author, err, env.PageUsers[k])
			}
		}
	}
	ctx := t.Context()
	if _, err := probe.NewSender("").Send(ctx, lines["consumers"], 1, "hi"); err == nil || !strings.HasPrefix(err.Error(), "401 ") {
		t.Errorf("without the token: %v, want 401", err)
	}
	if m, err := probe.NewSender(tok).Send(ctx, lines["consumers"], 1, "hi"); err != nil || m.Author != env.PageUsers["consumers"] {
		t.Errorf("with the token: author %q, %v; want 201 by %q", m.Author, err, env.PageUsers["consumers"])
	}
}
