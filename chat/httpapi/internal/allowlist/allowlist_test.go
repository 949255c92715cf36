package allowlist

import (
	"net/http"
	"testing"
)

func TestDefaultsAndLists(t *testing.T) {
	l, err := New(nil, nil, "10.0.0.5:8080")
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]bool{
		"10.0.0.5:8080": true, "localhost": true, "[::1]:8080": true, "evil.example": false, "10.0.0.6": false,
	} {
		if got := l.Host(host); got != want {
			t.Errorf("Host(%q) = %v, want %v", host, got, want)
		}
	}
	wild, err := New(nil, nil, "0.0.0.0:8080")
	if err != nil {
		t.Fatal(err)
	}
	if !wild.Host("192.0.2.7:8080") || wild.Host("rebound.example") {
		t.Error("unspecified listen host: want IP literals only")
	}
	r := &http.Request{Host: "localhost:8080", Header: http.Header{"Origin": {"http://localhost:8080"}}}
	if !l.Origin(r) {
		t.Error("the page's own origin refused")
	}
	r.Header.Set("Origin", "https://evil.example")
	if l.Origin(r) {
		t.Error("another site's origin allowed")
	}
	listed, err := New([]string{"chat.example"}, []string{"https://app.example"}, "127.0.0.1:8080")
	if err != nil {
		t.Fatal(err)
	}
	if !listed.Host("chat.example") || listed.Host("localhost") {
		t.Error("listed hosts: want the list alone")
	}
	r.Header.Set("Origin", "https://app.example")
	if !listed.Origin(r) {
		t.Error("listed origin refused")
	}
	for _, bad := range [][2][]string{{{"a/b"}, nil}, {nil, {"ftp://x.example"}}, {nil, {"https://x.example/path"}}} {
		if _, err := New(bad[0], bad[1], "127.0.0.1:8080"); err == nil {
			t.Errorf("New(%q, %q) succeeded", bad[0], bad[1])
		}
	}
}
