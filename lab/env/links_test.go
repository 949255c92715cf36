package env

import (
	"bufio"
	"net"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/lab/fault"
)

// TestNetFaults: a route through the in-process toxiproxy passes bytes; a
// latency toxic delays them, a black-hole swallows them until removed.
func TestNetFaults(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // a line echo server
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					l, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(l)); err != nil {
						return
					}
				}
			}()
		}
	}()
	nf := NewLinks()
	defer nf.Close()
	addr, err := nf.Route("svc", "echo", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	roundTrip := func(c net.Conn, r *bufio.Reader, wait time.Duration) (time.Duration, error) {
		start := time.Now()
		_ = c.SetDeadline(start.Add(wait))
		if _, err := c.Write([]byte("ping\n")); err != nil {
			return 0, err
		}
		_, err := r.ReadString('\n')
		return time.Since(start), err
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if _, err := roundTrip(c, r, 10*time.Second); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}
	name, err := nf.Add("svc>echo", fault.NetLatency, "downstream", map[string]int{"latency": 300})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := roundTrip(c, r, 10*time.Second); err != nil || d < 300*time.Millisecond {
		t.Fatalf("with 300 ms latency: round trip %v, %v", d, err)
	}
	nf.Remove("svc>echo", name)
	if _, err := nf.Add("svc>echo", fault.NetBlackHole, "upstream", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := roundTrip(c, r, 500*time.Millisecond); err == nil {
		t.Fatal("a black-holed link answered")
	}
	nf.Clear()
	c2, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, err := roundTrip(c2, bufio.NewReader(c2), 10*time.Second); err != nil {
		t.Fatalf("after the faults were cleared: %v", err)
	}
}
