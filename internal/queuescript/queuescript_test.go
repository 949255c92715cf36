package queuescript_test

import (
	"testing"

	"github.com/outboxchat/outboxchat/internal/queuescript"
	"github.com/outboxchat/outboxchat/internal/streamentry"
)

func TestAddArgs(t *testing.T) {
	t.Parallel()
	args := queuescript.AddArgs(1000, "tok", []streamentry.Fields{
		{ID: "a", Name: "n", Payload: []byte("p")},
		{ID: "b", Name: "m", Payload: []byte("q"), Sig: "s", Headers: map[string]string{"k": "v"}},
	})
	want := []any{int64(1000), "tok", "a", "n", "p", "", "", "b", "m", "q", "s", `{"k":"v"}`}
	if len(args) != len(want) {
		t.Fatalf("args %v, want %v", args, want)
	}
	for i, w := range want {
		got := args[i]
		if b, ok := got.([]byte); ok {
			got = string(b)
		}
		if got != w {
			t.Errorf("arg %d = %#v, want %#v", i, got, w)
		}
	}
}

func TestAddReply(t *testing.T) {
	t.Parallel()
	if a, f, m, ok := queuescript.AddReply([]any{int64(2), int64(3), "ERR x"}); !ok || a != 2 || f != 3 || m != "ERR x" {
		t.Errorf("reply decoded as %d %d %q %v", a, f, m, ok)
	}
	for _, bad := range [][]any{nil, {int64(1), int64(0)}, {"1", int64(0), ""}} {
		if _, _, _, ok := queuescript.AddReply(bad); ok {
			t.Errorf("AddReply(%v) ok", bad)
		}
	}
}

func TestJobFault(t *testing.T) {
	t.Parallel()
	for reply, want := range map[string]bool{
		"ERR Invalid stream ID specified as stream command argument":              true,
		"ERR The user executing the script can't access at least one of the keys": false,
		"ERR ACL failure in script: No permissions to run the 'xadd' command":     false,
		"OOM command not allowed when used memory > 'maxmemory'.":                 false,
	} {
		if got := queuescript.JobReply(reply).JobFault(); got != want {
			t.Errorf("JobFault(%q) = %v, want %v", reply, got, want)
		}
	}
}
