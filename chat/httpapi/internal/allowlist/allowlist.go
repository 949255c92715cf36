// Package allowlist holds the host and origin allow-lists of the HTTP
// guard: which Host headers the server answers (against DNS rebinding) and
// which browser origins may use the API (against cross-site requests).
package allowlist

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// List is a host and an origin allow-list. Immutable after New: safe for
// concurrent use.
type List struct {
	hosts     map[string]bool
	anyHost   bool
	anyIP     bool // unspecified listen host: IP literals pass
	origins   map[string]bool
	anyOrigin bool
}

// New returns the lists of a server listening on listenAddr
// ("host:port"). hosts are host names (no port; "*" allows every host);
// none means the listen host, "localhost", "127.0.0.1" and "::1", and any
// IP literal when the listen host is unspecified (0.0.0.0, ::, ""), as an
// IP literal cannot be rebound. origins are "scheme://host[:port]" with
// scheme http or https ("*" allows every origin); none means the page's
// own origin on an allowed host. Errors: a listen address without a port
// (when hosts is empty), a host or origin that is not of that form.
func New(hosts, origins []string, listenAddr string) (*List, error) {
	l := &List{hosts: map[string]bool{}, origins: map[string]bool{}}
	if len(hosts) == 0 {
		host, _, err := net.SplitHostPort(listenAddr)
		if err != nil {
			return nil, fmt.Errorf("allowed hosts: listen address %q: %w", listenAddr, err)
		}
		if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
			l.anyIP = true
		} else {
			l.hosts[strings.ToLower(host)] = true
		}
		for _, h := range []string{"localhost", "127.0.0.1", "::1"} {
			l.hosts[h] = true
		}
	}
	for _, h := range hosts {
		h = strings.ToLower(strings.TrimSpace(h))
		switch {
		case h == "*":
			l.anyHost = true
		case h == "" || strings.Contains(h, "/"):
			return nil, fmt.Errorf("allowed hosts: %q is not a host name", h)
		default:
			l.hosts[strings.Trim(h, "[]")] = true
		}
	}
	for _, o := range origins {
		o = strings.ToLower(strings.TrimSpace(o))
		if o == "*" {
			l.anyOrigin = true
			continue
		}
		u, err := url.Parse(o)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
			return nil, fmt.Errorf("allowed origins: %q is not scheme://host[:port]", o)
		}
		l.origins[u.Scheme+"://"+u.Host] = true
	}
	return l, nil
}

// Host reports whether a Host header (hostport, the port optional) names
// an allowed host.
func (l *List) Host(hostport string) bool {
	if l.anyHost {
		return true
	}
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.ToLower(strings.Trim(host, "[]"))
	if l.hosts[host] {
		return true
	}
	return l.anyIP && net.ParseIP(host) != nil
}

// Origin reports whether r's Origin (if any: a request without one, not
// a browser's, passes) may use the API.
func (l *List) Origin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" || l.anyOrigin {
		return true
	}
	u, err := url.Parse(strings.ToLower(o))
	if err != nil || u.Host == "" {
		return false
	}
	if len(l.origins) > 0 {
		return l.origins[u.Scheme+"://"+u.Host]
	}
	return strings.EqualFold(u.Host, r.Host) && l.Host(u.Host)
}
