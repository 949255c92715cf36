package jsonenc

import (
	"encoding/json"
	"testing"
	"time"
)

// FuzzAppendString: AppendString gives encoding/json's bytes for any string.
func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "plain", `"quoted" \ back`, "<a&b>", "\x00\x1f\t\n\r\b\f", "\u2028\u2029", "\xff\xfe bad", "日本語"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := AppendString(nil, s); string(got) != string(want) {
			t.Errorf("AppendString(%q) = %s, want %s", s, got, want)
		}
	})
}

// AppendTime and AppendOptTime write TimeLayout in UTC, quoted; nil is null.
func TestAppendTime(t *testing.T) {
	loc := time.FixedZone("x", 3600)
	for _, tm := range []time.Time{
		time.Date(2024, 2, 29, 23, 59, 58, 123456789, loc),
		time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(12345, 6, 7, 8, 9, 10, 11000, time.UTC),
	} {
		want, _ := json.Marshal(tm.UTC().Format(TimeLayout))
		if got := AppendTime(nil, tm); string(got) != string(want) {
			t.Errorf("AppendTime(%v) = %s, want %s", tm, got, want)
		}
		if got := AppendOptTime(nil, &tm); string(got) != string(want) {
			t.Errorf("AppendOptTime(%v) = %s, want %s", tm, got, want)
		}
	}
	if got := AppendOptTime([]byte("x"), nil); string(got) != "xnull" {
		t.Errorf("AppendOptTime(nil) = %s, want xnull", got)
	}
}
