// Package forwarded finds the client of a request that came through
// trusted reverse proxies, by its X-Forwarded-For headers.
package forwarded

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"
)

// ParsePrefixes parses a comma-separated list of CIDRs and bare IPs
// ("10.0.0.0/8, 192.168.1.7, fd00::/8"; a bare IP is a /32 or /128); ""
// gives nil. Error: an element that is neither, naming it.
func ParsePrefixes(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if p, err := netip.ParsePrefix(f); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, fmt.Errorf("trusted proxies: %q is not a CIDR or an IP address", f)
		}
		out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return out, nil
}

// Client returns the client r came from by its X-Forwarded-For headers:
// the rightmost hop that is not in trusted (so a client cannot choose its
// address by sending the header itself: only the hops the trusted proxies
// appended are believed), or, when every hop is trusted, the leftmost;
// hops left of one that does not parse are ignored. It returns false
// when r's connecting address (RemoteAddr) is not in trusted or the
// headers name no valid hop.
func Client(r *http.Request, trusted []netip.Prefix) (netip.Addr, bool) {
	peer, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil || !in(trusted, peer.Addr().Unmap()) {
		return netip.Addr{}, false
	}
	hdrs := r.Header.Values("X-Forwarded-For")
	var client netip.Addr
	for i := len(hdrs) - 1; i >= 0; i-- {
		hops := strings.Split(hdrs[i], ",")
		for j := len(hops) - 1; j >= 0; j-- {
			hop, ok := parseHop(hops[j])
			if !ok {
				return client, client.IsValid()
			}
			client = hop
			if !in(trusted, hop) {
				return client, true
			}
		}
	}
	return client, client.IsValid()
}

// in reports whether a is in one of nets.
func in(nets []netip.Prefix, a netip.Addr) bool {
	for _, p := range nets {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// parseHop parses one X-Forwarded-For element: an IP, or an IP with a port
// ("1.2.3.4:5", "[::1]:5"), as some proxies write it.
func parseHop(s string) (netip.Addr, bool) {
	s = strings.TrimSpace(s)
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap(), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap(), true
	}
	return netip.Addr{}, false
}
