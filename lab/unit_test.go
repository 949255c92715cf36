package lab

import (
	"bytes"
	"slices"
	"testing"
	"time"

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

func TestMsgNumber(t *testing.T) {
	for _, tc := range []struct {
		body string
		seq  int64
		want int
	}{
		{"msg 7", 3, 7}, {"msg x", 3, 3}, {"hello", 9, 9}, {"msg 10", 10, 10},
	} {
		if got := msgNumber(tc.body, tc.seq); got != tc.want {
			t.Errorf("msgNumber(%q, %d) = %d, want %d", tc.body, tc.seq, got, tc.want)
		}
	}
}

func TestWithoutFlag(t *testing.T) {
	got := withoutFlag([]string{"--a", "1", "--fault", "k:2", "--b", "x"}, "--fault")
	if want := []string{"--a", "1", "--b", "x"}; !slices.Equal(got, want) {
		t.Fatalf("withoutFlag = %q, want %q", got, want)
	}
}

func TestWriteSummary(t *testing.T) {
	for _, tc := range []struct {
		f    Figures
		want string
	}{
		{Figures{Saved: 10, Received: 10, DuplicatesSkipped: 1},
			"saved by consumers: 10   received by workers: 10   duplicates skipped: 1\nlost: none\nunsent in outbox: 0\n"},
		{Figures{Saved: 10, Received: 8, Lost: []int{7, 8}},
			"saved by consumers: 10   received by workers: 8   duplicates skipped: 0\nlost: msg 7, msg 8\nunsent in outbox: 0\n"},
	} {
		var b bytes.Buffer
		tc.f.WriteSummary(&b)
		if b.String() != tc.want {
			t.Errorf("summary =\n%s\nwant\n%s", b.String(), tc.want)
		}
	}
}

func TestEventLogFormat(t *testing.T) {
	var b bytes.Buffer
	l := &eventLog{w: &b}
	l.start()
	l.at(l.t0.Add(3800*time.Millisecond), "deploy", "workers stopped")
	l.at(l.t0.Add(13100*time.Millisecond), "workers", "msg 2 again, already in inbox, skipped")
	want := "  3.8s  deploy:    workers stopped\n 13.1s  workers:   msg 2 again, already in inbox, skipped\n"
	if b.String() != want {
		t.Fatalf("log =\n%q\nwant\n%q", b.String(), want)
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

func TestWindowRates(t *testing.T) {
	start := time.Unix(1000, 0)
	at := func(ms int) time.Time { return start.Add(time.Duration(ms) * time.Millisecond) }
	for _, tc := range []struct {
		name string
		ts   []time.Time
		want []float64
	}{
		{"none", nil, []float64{}},
		{"two full windows and a short last one dropped", []time.Time{at(0), at(5000), at(9999), at(10000), at(10500)}, []float64{0.3}},
		{"partial last window counted over its length", []time.Time{at(1000), at(12000), at(15000)}, []float64{0.1, 0.4}},
		{"before start ignored", []time.Time{at(-5), at(3000), at(10000)}, []float64{0.1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := windowRates(start, tc.ts, 10*time.Second); !slices.Equal(got, tc.want) {
				t.Errorf("windowRates = %v, want %v", got, tc.want)
			}
		})
	}
}
