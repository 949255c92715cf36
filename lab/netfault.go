package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// Network fault kinds of lab torture, each a toxiproxy toxic (or, for
// black-hole, a toxic used so): see netFaults.add.
const (
	NetLatency   = "latency"    // every chunk delayed by latency ± jitter ms
	NetTimeout   = "timeout"    // data dropped, the connection closed after timeout ms
	NetReset     = "reset_peer" // connections reset (RST) after timeout ms
	NetBandwidth = "bandwidth"  // throughput capped at rate KB/s
	NetBlackHole = "black-hole" // data dropped, the connection never closed
)

// netKinds lists the network fault kinds in the order schedules draw them.
var netKinds = []string{NetLatency, NetTimeout, NetReset, NetBandwidth, NetBlackHole}

// netFaults runs toxiproxy in the lab's process, as a library: one TCP proxy
// per service and server ("consumers>postgres", "workers>redis", …) that
// the service connects through (EnvOptions.Route), and toxics added to and
// removed from those proxies while a schedule runs. Safe for concurrent
// use; close stops every proxy and its connections.
type netFaults struct {
	server *toxiproxy.ApiServer

	mu      sync.Mutex
	proxies map[string]*toxiproxy.Proxy // "service>server" → proxy
	next    int
}

func newNetFaults() *netFaults {
	// The toxics log through zerolog's global logger (a trace line per
	// interrupted chunk); the lab does not use zerolog otherwise.
	zerolog.SetGlobalLevel(zerolog.Disabled)
	return &netFaults{
		server:  toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop()),
		proxies: map[string]*toxiproxy.Proxy{},
	}
}

// route is an EnvOptions.Route: it starts a proxy from a free local port to
// addr and returns the proxy's address.
func (n *netFaults) route(service, server, addr string) (string, error) {
	key := service + ">" + server
	p := toxiproxy.NewProxy(n.server, key, "127.0.0.1:0", addr)
	if err := p.Start(); err != nil {
		return "", fmt.Errorf("toxiproxy %s: %w", key, err)
	}
	n.mu.Lock()
	n.proxies[key] = p
	n.mu.Unlock()
	return p.Listen, nil
}

// add puts a toxic of kind on link's stream ("upstream": service to server;
// "downstream": back) with the given attributes (toxiproxy's, in ms or
// KB/s) and returns its name, for remove.
func (n *netFaults) add(link, kind, stream string, attrs map[string]int) (string, error) {
	n.mu.Lock()
	p := n.proxies[link]
	n.next++
	name := fmt.Sprintf("t%d", n.next)
	n.mu.Unlock()
	if p == nil {
		return "", fmt.Errorf("toxiproxy: no link %q", link)
	}
	typ := kind
	if kind == NetBlackHole {
		typ, attrs = NetTimeout, map[string]int{"timeout": 0} // timeout 0: never closed
	}
	b, err := json.Marshal(map[string]any{"name": name, "type": typ, "stream": stream, "toxicity": 1.0, "attributes": attrs})
	if err != nil {
		return "", err
	}
	if _, err := p.Toxics.AddToxicJson(strings.NewReader(string(b))); err != nil {
		return "", fmt.Errorf("toxiproxy %s: add %s: %w", link, kind, err)
	}
	return name, nil
}

// remove takes toxic name off link (a toxic already gone is not an error).
func (n *netFaults) remove(link, name string) {
	n.mu.Lock()
	p := n.proxies[link]
	n.mu.Unlock()
	if p != nil {
		_ = p.Toxics.RemoveToxic(context.Background(), name)
	}
}

// clear removes every toxic of every proxy.
func (n *netFaults) clear() {
	n.mu.Lock()
	ps := make([]*toxiproxy.Proxy, 0, len(n.proxies))
	for _, p := range n.proxies {
		ps = append(ps, p)
	}
	n.mu.Unlock()
	for _, p := range ps {
		p.Toxics.ResetToxics(context.Background())
	}
}

// close stops every proxy (closing its connections).
func (n *netFaults) close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for k, p := range n.proxies {
		p.Stop()
		delete(n.proxies, k)
	}
}
