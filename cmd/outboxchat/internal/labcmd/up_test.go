package labcmd

import (
	"net"
	"strings"
	"testing"
)

func TestLoopbackAddr(t *testing.T) {
	t.Parallel()
	// The parsing is checked without the free-port probe: a port picked
	// free here may be taken by a parallel test's server a moment later.
	p := "45947"
	for in, want := range map[string]string{
		"":               "",
		p:                "127.0.0.1:" + p,
		":" + p:          "127.0.0.1:" + p,
		"localhost:" + p: "127.0.0.1:" + p,
		"127.0.0.1:" + p: "127.0.0.1:" + p,
		"[::1]:" + p:     "[::1]:" + p,
	} {
		if got, err := parseLoopbackAddr("--x", in); err != nil || got != want {
			t.Errorf("parseLoopbackAddr(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"0", "65536", "x", "0.0.0.0:" + p, "192.0.2.1:" + p, "example.com:" + p} {
		if got, err := parseLoopbackAddr("--x", bad); err == nil {
			t.Errorf("parseLoopbackAddr(%q) = %q, want an error", bad, got)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	taken := ln.Addr().String()
	if _, err := loopbackAddr("--x", taken); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("a taken port: %v, want \"address already in use\"", err)
	}
}
