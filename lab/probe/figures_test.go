package probe

import (
	"bytes"
	"testing"
	"time"
)

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
	l := NewEventLog(&b)
	l.Start()
	l.At(l.t0.Add(3800*time.Millisecond), "deploy", "workers stopped")
	l.At(l.t0.Add(13100*time.Millisecond), "workers", "msg 2 again, already in inbox, skipped")
	want := "  3.8s  deploy:    workers stopped\n 13.1s  workers:   msg 2 again, already in inbox, skipped\n"
	if b.String() != want {
		t.Fatalf("log =\n%q\nwant\n%q", b.String(), want)
	}
}
