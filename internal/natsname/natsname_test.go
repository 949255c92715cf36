package natsname

import "testing"

func TestValidAndSafe(t *testing.T) {
	for _, tc := range []struct {
		in, safe string
		valid    bool
	}{
		{"", "", false},
		{"outboxchat_consumers-1", "outboxchat_consumers-1", true},
		{"outboxchat:", "outboxchat_", false},
		{"consumers.p1", "consumers_p1", false},
		{"a b*>/é", "a_b____", false},
	} {
		if got := Valid(tc.in); got != tc.valid {
			t.Errorf("Valid(%q) = %v, want %v", tc.in, got, tc.valid)
		}
		if got := Safe(tc.in); got != tc.safe {
			t.Errorf("Safe(%q) = %q, want %q", tc.in, got, tc.safe)
		}
		if s := Safe(tc.in); s != "" && !Valid(s) {
			t.Errorf("Safe(%q) = %q is not Valid", tc.in, s)
		}
	}
}
