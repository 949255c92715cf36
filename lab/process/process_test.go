package process

import (
	"strings"
	"testing"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/inbox"
)

func TestParseStatCPU(t *testing.T) {
	for _, tc := range []struct {
		name, stat string
		want       float64
		ok         bool
	}{
		{"plain", "123 (outboxchat) S 1 123 123 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 8 0", 3.0, true},
		{"spaces and parens in name", "7 (a (b) c) R 1 7 7 0 -1 0 0 0 0 0 1 2 0 0", 0.03, true},
		{"truncated", "7 (x) R 1 2", 0, false},
		{"no name", "garbage", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStatCPU(tc.stat)
			if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
				t.Fatalf("parseStatCPU = %v, %v; want %v ok=%v", got, err, tc.want, tc.ok)
			}
		})
	}
}

func TestParseProcStat(t *testing.T) {
	got, err := parseProcStat("123 (a) b) S 42 123 123 0 -1 4194560 100 0 0 0 250 50 30 20 20 0 8 0")
	if want := (procStat{ppid: 42, self: 3.0, child: 0.5}); err != nil || got != want {
		t.Fatalf("parseProcStat = %+v, %v; want %+v", got, err, want)
	}
	if _, err := parseProcStat("7 (x) R notapid 7 7 0 -1 0 0 0 0 0 1 2 0 0"); err == nil {
		t.Fatal("parseProcStat accepted a malformed ppid")
	}
}

func TestLogLineEvent(t *testing.T) {
	ev := LogLine{Msg: chat.EventLogMsg, Attrs: map[string]any{chat.EventKey: string(inbox.EventDuplicate)}}
	if got := ev.Event(); got != string(inbox.EventDuplicate) {
		t.Fatalf("Event() = %q, want %q", got, inbox.EventDuplicate)
	}
	// Any other line is no event, whatever its attributes.
	other := LogLine{Msg: "duplicate skipped", Attrs: map[string]any{chat.EventKey: string(inbox.EventDuplicate)}}
	if got := other.Event(); got != "" {
		t.Fatalf("Event() of a plain log line = %q, want none", got)
	}
}

// The start line a process's log gets names its URLs without their
// passwords, and leaves every other argument as it is.
func TestRedactArgs(t *testing.T) {
	t.Parallel()
	in := []string{"REDIS_URL=redis://workers:beef@127.0.0.1:6379/0", "OUTBOXCHAT_X=a=b", "serve",
		"--service", "consumers", "--database-url", "postgres://consumers:s3cret@127.0.0.1:5432/chat?sslmode=disable",
		"--redis-url", "redis://consumers:f00d@127.0.0.1:6379/0", "--broker-url", "nats://127.0.0.1:4222", "--fault=x"}
	got := strings.Join(redactArgs(in), " ")
	for _, secret := range []string{"s3cret", "f00d", "beef"} {
		if strings.Contains(got, secret) {
			t.Fatalf("start line %q holds a password", got)
		}
	}
	for _, keep := range []string{"--service consumers", "postgres://consumers:xxxxx@127.0.0.1:5432/chat?sslmode=disable",
		"redis://consumers:xxxxx@127.0.0.1:6379/0", "nats://127.0.0.1:4222",
		"REDIS_URL=redis://workers:xxxxx@127.0.0.1:6379/0 OUTBOXCHAT_X=a=b serve", "--fault=x"} {
		if !strings.Contains(got, keep) {
			t.Fatalf("start line %q lacks %q", got, keep)
		}
	}
}
