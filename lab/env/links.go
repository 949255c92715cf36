package env

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"

	"github.com/outboxchat/outboxchat/lab/fault"
)

// Links runs toxiproxy in the lab's process, as a library: one TCP proxy
// per service and server ("consumers>postgres", "workers>redis", …) that
// the service connects through (Options.Route = Links.Route), and toxics
// (fault.Net faults) added to and removed from those proxies while a run
// goes on. Safe for concurrent use; Close stops every proxy and its
// connections.
type Links struct {
	server *toxiproxy.ApiServer

	mu      sync.Mutex
	proxies map[string]*toxiproxy.Proxy // "service>server" → proxy
	next    int
}

// NewLinks returns Links without proxies; Route adds them.
func NewLinks() *Links {
	// The toxics log through zerolog's global logger (a trace line per
	// interrupted chunk); the lab does not use zerolog otherwise.
	zerolog.SetGlobalLevel(zerolog.Disabled)
	return &Links{
		server:  toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop()),
		proxies: map[string]*toxiproxy.Proxy{},
	}
}

// Route is an Options.Route: it starts a proxy from a free local port to
// addr and returns the proxy's address.
func (n *Links) Route(service, server, addr string) (string, error) {
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

// Add puts a toxic of kind on link's stream ("upstream": service to server;
// "downstream": back) with the given attributes (toxiproxy's, in ms or
// KB/s) and returns its name, for Remove.
func (n *Links) Add(link, kind, stream string, attrs map[string]int) (string, error) {
	n.mu.Lock()
	p := n.proxies[link]
	n.next++
	name := fmt.Sprintf("t%d", n.next)
	n.mu.Unlock()
	if p == nil {
		return "", fmt.Errorf("toxiproxy: no link %q", link)
	}
	typ := kind
	if kind == fault.NetBlackHole {
		typ, attrs = fault.NetTimeout, map[string]int{"timeout": 0} // timeout 0: never closed
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

// Remove takes toxic name off link (a toxic already gone is not an error).
func (n *Links) Remove(link, name string) {
	n.mu.Lock()
	p := n.proxies[link]
	n.mu.Unlock()
	if p != nil {
		_ = p.Toxics.RemoveToxic(context.Background(), name)
	}
}

// Clear removes every toxic of every proxy.
func (n *Links) Clear() {
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

// Close stops every proxy (closing its connections).
func (n *Links) Close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for k, p := range n.proxies {
		p.Stop()
		delete(n.proxies, k)
	}
}
