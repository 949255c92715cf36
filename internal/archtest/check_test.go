package archtest

import (
	"slices"
	"strings"
	"testing"
)

const root = "example.com/p"

// pkg is the package rel of the synthetic project root; an import "~x" is
// the project's package x, any other is std or another module's.
func pkg(rel string, imports []string, testImports ...string) Package {
	full := func(list []string) []string {
		var out []string
		for _, s := range list {
			if rel, ok := strings.CutPrefix(s, "~"); ok {
				s = root + "/" + rel // the project's
			}
			out = append(out, s)
		}
		return out
	}
	path := root + "/" + rel
	if rel == "." {
		path = root
	}
	return Package{ImportPath: path, Imports: full(imports), TestImports: full(testImports)}
}

// TestCheck runs the project's tables on small synthetic graphs: an allowed
// arrow is not reported, a forbidden one is, by name.
func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name    string
		interim bool // with one synthetic Interim; else the final tables alone
		pkgs    []Package
		want    []string // substrings, one per reported line, in order; none: no report
	}{{
		name: "library imports library and std",
		pkgs: []Package{pkg("outbox", []string{"~internal/service", "~internal/notifier", "context", "github.com/jackc/pgx/v5/pgxpool"})},
	}, {
		name: "library imports the app",
		pkgs: []Package{pkg("outbox", []string{"~chat"}), pkg("chat", nil)},
		want: []string{"outbox → chat: layer library may not import layer chat"},
	}, {
		name: "library imports a module outside its list",
		pkgs: []Package{pkg("redisq", []string{"github.com/prometheus/client_golang/prometheus"})},
		want: []string{"redisq → github.com/prometheus/client_golang/prometheus: layer library may use no module"},
	}, {
		name: "library test imports testenv, non-test code does not",
		pkgs: []Package{
			pkg("inbox", []string{"~redisq"}, "~internal/testenv", "~inbox", "go.uber.org/goleak"),
			pkg("outbox", []string{"~internal/testenv"}),
		},
		want: []string{"outbox → internal/testenv: layer library may not import layer testenv"},
	}, {
		name: "the parts import the vocabulary, not each other except receive → store",
		pkgs: []Package{
			pkg("chat/store", []string{"~chat", "~chat/schema", "~outbox"}),
			pkg("chat/receive", []string{"~chat/store", "~chat/auth"}),
			pkg("chat/gateway", []string{"~chat/store"}),
		},
		want: []string{"chat/gateway → chat/store: layer gateway may not import layer store"},
	}, {
		name: "httpapi depends on interfaces, not on the parts",
		pkgs: []Package{pkg("chat/httpapi", []string{"~chat", "~chat/web", "~chat/status"}, "~chat/gateway")},
		want: []string{"chat/httpapi (test) → chat/gateway: layer http may not import layer gateway"},
	}, {
		name: "the vocabulary imports no part",
		pkgs: []Package{pkg("chat", []string{"~chat/auth", "~redisq"}), pkg("chat/server", []string{"~chat", "~chat/httpapi", "~chat/store"})},
		want: []string{"chat → chat/auth: layer chat may not import layer auth"},
	}, {
		name: "the app imports neither lab nor cmd; the lab not cmd",
		pkgs: []Package{pkg("chat/server", []string{"~lab"}), pkg("lab/env", []string{"~chat/server", "~cmd/outboxchat"}), pkg("cmd/outboxchat", []string{"~lab", "~chat/server"})},
		want: []string{"chat/server → lab: layer server may not import layer lab", "lab/env → cmd/outboxchat: layer lab may not import layer cmd"},
	}, {
		name: "deploy's test runs the lab through labtest",
		pkgs: []Package{pkg("deploy", nil, "~lab", "~lab/labtest"), pkg("lab/labtest", []string{"~lab", "~internal/testenv"})},
	}, {
		name: "a package in no layer",
		pkgs: []Package{pkg("tools/gen", nil), pkg("chat/newpart", nil)},
		want: []string{"package chat/newpart is placed in no layer", "package tools/gen is placed in no layer"},
	}, {
		name:    "the interim arrow holds until its package exists",
		interim: true,
		pkgs:    []Package{pkg("chat", []string{"~chat/web"}), pkg("chat/web", nil)},
	}, {
		name:    "the interim arrow ends when its package exists",
		interim: true,
		pkgs:    []Package{pkg("chat", []string{"~chat/web"}), pkg("chat/web", nil), pkg("chat/server", []string{"~chat/web"})},
		want:    []string{"chat → chat/web: layer chat may not import layer http", "interim chat → chat/web has ended"},
	}, {
		name: "presence is the app's: the library declares none",
		pkgs: []Package{
			{ImportPath: root + "/redisq", Decls: []string{"Keys", "NewKeys", "DeleteIdleConsumers"}, Embeds: []string{"scripts/add.lua"}},
			{ImportPath: root + "/redisq/x", Decls: []string{"Presence.Claim", "livePresence"}, Embeds: []string{"scripts/presence.lua"}},
			{ImportPath: root + "/chat/presence", Decls: []string{"Process", "presenceMember"}, Embeds: []string{"scripts/presence.lua"}},
		},
		want: []string{"redisq/x declares Presence.Claim: layer library may have no presence",
			"redisq/x declares livePresence", "redisq/x embeds scripts/presence.lua"},
	}, {
		name: "the library may not import chat/presence",
		pkgs: []Package{pkg("redisq", []string{"~chat/presence"}), pkg("chat/presence", []string{"~redisq"})},
		want: []string{"redisq → chat/presence: layer library may not import layer presence"},
	}, {
		name: "packages outside the root module are not the project's",
		pkgs: []Package{{ImportPath: "example.com/other", Imports: []string{root + "/cmd/x"}}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			r := Project()
			r.Interims = nil
			if tc.interim {
				r.Interims = []Interim{{From: "chat", To: "chat/web", Until: "chat/server", Why: "a step of a restructuring"}}
			}
			got := r.Check(root, tc.pkgs)
			if len(got) != len(tc.want) {
				t.Fatalf("got %d reports, want %d:\n%s", len(got), len(tc.want), strings.Join(got, "\n"))
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("report %d = %q, want it to contain %q", i, got[i], w)
				}
			}
		})
	}
}

// TestPlace checks the pattern matching: "x" is x alone, "x/..." is x and
// below, the longest pattern wins.
func TestPlace(t *testing.T) {
	r := Project()
	for rel, want := range map[string]string{
		"outbox":                 library,
		"outbox/internal/x":      library,
		"outboxtest":             library,
		"internal/spawn":         library,
		"internal/testenv":       testenv,
		"internal/archtest":      archtest,
		"chat":                   vocab,
		"chat/web":               http,
		"chat/httpapi":           http,
		"chat/store":             store,
		"chat/internal/chattest": chattest,
		"lab":                    lab,
		"lab/labtest":            labtest,
		"cmd/outboxchat":         cmd,
		"deploy":                 deploy,
		"chat/storex":            "",
		"outboxy":                "",
		".":                      "",
	} {
		got, ok := r.place(rel)
		if got != want || ok != (want != "") {
			t.Errorf("place(%q) = %q, %v; want %q", rel, got, ok, want)
		}
	}
}

// TestValidate checks that the project's tables are consistent and that
// an undefined layer is reported.
func TestValidate(t *testing.T) {
	if p := Project().Validate(); len(p) > 0 {
		t.Fatalf("project tables: %v", p)
	}
	r := Project()
	r.Places = append(slices.Clone(r.Places), Place{"tools/...", "tools"})
	if p := r.Validate(); len(p) != 1 || !strings.Contains(p[0], `"tools"`) {
		t.Errorf("Validate with an undefined layer = %v", p)
	}
}
