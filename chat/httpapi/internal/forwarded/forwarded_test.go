package forwarded

import (
	"net/http"
	"testing"
)

// The client IP of a request by its peer and X-Forwarded-For headers.
func TestClient(t *testing.T) {
	tp, err := ParsePrefixes("10.0.0.0/8, 192.168.1.7,fd00::/8")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, peer string
		xff        []string
		want       string // "" = RemoteAddr kept
	}{
		{"untrusted peer: header ignored", "203.0.113.9:4000", []string{"198.51.100.1"}, ""},
		{"trusted peer, no header", "10.1.2.3:4000", nil, ""},
		{"trusted peer: its hop", "10.1.2.3:4000", []string{"198.51.100.1"}, "198.51.100.1"},
		{"spoofed left part ignored", "10.1.2.3:4000", []string{"6.6.6.6, 198.51.100.1"}, "198.51.100.1"},
		{"trusted hops skipped", "10.1.2.3:4000", []string{"6.6.6.6, 198.51.100.1, 192.168.1.7, 10.9.9.9"}, "198.51.100.1"},
		{"several headers, last is nearest", "10.1.2.3:4000", []string{"6.6.6.6", "198.51.100.1, 10.0.0.2"}, "198.51.100.1"},
		{"all trusted: the leftmost", "10.1.2.3:4000", []string{"10.0.0.5, 10.0.0.6"}, "10.0.0.5"},
		{"garbage stops the walk", "10.1.2.3:4000", []string{"6.6.6.6, junk, 10.0.0.6"}, "10.0.0.6"},
		{"garbage nearest: peer kept", "10.1.2.3:4000", []string{"6.6.6.6, junk"}, ""},
		{"hop with a port", "10.1.2.3:4000", []string{"198.51.100.1:5555"}, "198.51.100.1"},
		{"IPv6 peer and hop", "[fd00::1]:4000", []string{"2001:db8::7"}, "2001:db8::7"},
		{"IPv4-mapped peer", "[::ffff:10.1.2.3]:4000", []string{"198.51.100.1"}, "198.51.100.1"},
	} {
		r := &http.Request{RemoteAddr: tc.peer, Header: http.Header{}}
		for _, v := range tc.xff {
			r.Header.Add("X-Forwarded-For", v)
		}
		got, ok := Client(r, tp)
		if tc.want == "" {
			if ok {
				t.Errorf("%s: client %v, want the peer kept", tc.name, got)
			}
			continue
		}
		if !ok || got.String() != tc.want {
			t.Errorf("%s: client %v %v, want %s", tc.name, got, ok, tc.want)
		}
	}
	for _, bad := range []string{"10.0.0.0/33", "host.example", "1.2.3"} {
		if _, err := ParsePrefixes(bad); err == nil {
			t.Errorf("ParsePrefixes(%q) succeeded", bad)
		}
	}
}
