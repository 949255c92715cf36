package httpapi

import (
	"cmp"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/outboxchat/outboxchat/chat/httpapi/internal/allowlist"
	"github.com/outboxchat/outboxchat/chat/httpapi/internal/forwarded"
	"github.com/outboxchat/outboxchat/chat/httpapi/internal/limit"
)

// Defaults of GuardConfig. The timeouts follow the usual advice for a Go
// server facing the internet (Cloudflare's "So you want to expose Go on the
// Internet", 2016: bound the header read, the body read and idle
// keep-alives); the rates are a chat user's generous ceiling, not a
// measured figure: a person sends a few messages per second at most.
const (
	DefaultReadHeaderTimeout = 5 * time.Second
	DefaultBodyReadTimeout   = 10 * time.Second
	DefaultIdleTimeout       = 60 * time.Second
	DefaultPingInterval      = 20 * time.Second
	DefaultPongTimeout       = 10 * time.Second
	DefaultUserRate          = 20  // requests (and WebSocket sends) per second per user
	DefaultUserBurst         = 40  // requests at once per user
	DefaultIPRate            = 100 // requests per second per client IP
	DefaultIPBurst           = 200 // requests at once per client IP
	DefaultSocketsPerUser    = 16  // open WebSockets per user
)

// GuardConfig bounds what one client can take from a service's HTTP server.
// A zero field means its default; a negative rate, burst or cap turns that
// limit off (the lab's bench does, to measure the pipeline rather than the
// limiter).
type GuardConfig struct {
	// AllowedHosts are the host names (no port) the Host header may name;
	// any other gets 421, which defeats DNS rebinding (a hostile page whose
	// name was re-pointed at this server sends its own name as Host).
	// Default: the listen host, "localhost", "127.0.0.1" and "::1"; when the
	// listen host is unspecified (0.0.0.0, ::), also any IP literal (an IP
	// literal cannot be rebound). "*" allows every host.
	AllowedHosts []string
	// AllowedOrigins are the origins ("scheme://host[:port]") a browser
	// page may open a WebSocket or POST from. Default: the page's own
	// origin (Origin's host:port equals Host) on an allowed host. "*"
	// allows every origin. A request without Origin (not a browser) passes.
	AllowedOrigins []string
	// ReadHeaderTimeout bounds reading a request's headers. Default
	// DefaultReadHeaderTimeout (5 s).
	ReadHeaderTimeout time.Duration
	// BodyReadTimeout bounds reading a request's body, from the end of its
	// headers: a client trickling its body is cut with 408 and the
	// connection closed. Default DefaultBodyReadTimeout (10 s).
	BodyReadTimeout time.Duration
	// IdleTimeout closes a keep-alive connection with no request for this
	// long. Default DefaultIdleTimeout (60 s).
	IdleTimeout time.Duration
	// PingInterval is how often a WebSocket is pinged; PongTimeout how long
	// the pong may take before the connection is dropped (logged and
	// counted). Defaults DefaultPingInterval (20 s), DefaultPongTimeout
	// (10 s).
	PingInterval, PongTimeout time.Duration
	// UserRate and UserBurst limit each user's API requests and WebSocket
	// sends (token bucket: UserRate per second, UserBurst at once); over it
	// gets 429 with Retry-After (or an error frame on a WebSocket).
	// Defaults DefaultUserRate, DefaultUserBurst. Without auth the user is
	// the client IP.
	UserRate  float64
	UserBurst int
	// IPRate and IPBurst limit each client IP's API and WebSocket requests
	// the same way (the connecting address, or the one TrustedProxies
	// finds in X-Forwarded-For). Defaults DefaultIPRate, DefaultIPBurst.
	IPRate  float64
	IPBurst int
	// TrustedProxies are the networks of the reverse proxies in front of
	// the server (ParseTrustedProxies). A request whose connecting address
	// is in one of them counts as coming from the rightmost address of its
	// X-Forwarded-For headers that is not itself in one (so a client
	// cannot choose its address by sending the header itself: only the
	// hops the trusted proxies appended are believed), or, when every hop
	// is trusted, the leftmost; hops left of one that does not parse are
	// ignored. That address is the client IP of the rate limits, of the
	// per-user limits without auth, and of the logs (the request's
	// RemoteAddr, port 0). Default nil: X-Forwarded-For is ignored and
	// the client IP is the connecting address, behind a proxy the
	// proxy's.
	TrustedProxies []netip.Prefix
	// SocketsPerUser caps a user's open WebSockets; one more gets 429.
	// Default DefaultSocketsPerUser.
	SocketsPerUser int
}

// withDefaults fills zero fields.
func (c GuardConfig) withDefaults() GuardConfig {
	c.ReadHeaderTimeout = cmp.Or(c.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	c.BodyReadTimeout = cmp.Or(c.BodyReadTimeout, DefaultBodyReadTimeout)
	c.IdleTimeout = cmp.Or(c.IdleTimeout, DefaultIdleTimeout)
	c.PingInterval = cmp.Or(c.PingInterval, DefaultPingInterval)
	c.PongTimeout = cmp.Or(c.PongTimeout, DefaultPongTimeout)
	c.UserRate = cmp.Or(c.UserRate, DefaultUserRate)
	c.UserBurst = cmp.Or(c.UserBurst, DefaultUserBurst)
	c.IPRate = cmp.Or(c.IPRate, DefaultIPRate)
	c.IPBurst = cmp.Or(c.IPBurst, DefaultIPBurst)
	c.SocketsPerUser = cmp.Or(c.SocketsPerUser, DefaultSocketsPerUser)
	return c
}

// guard is the HTTP server's defence against hostile connections: host and
// origin allow-lists, the declared-size check, the body read deadline, rate
// limits and the WebSocket cap. Safe for concurrent use.
type guard struct {
	cfg        GuardConfig
	allowed    *allowlist.List
	maxRequest int64 // declared Content-Length above this gets 413 unread
	ips, users *limit.Rate
	sockets    *limit.Cap // by user
	log        *slog.Logger
	// refused counts refusals by reason (host, origin, too_large,
	// body_timeout, rate_ip, rate_user, sockets); nil = not counted.
	refused func(reason string)
}

// newGuard returns the guard of a server listening on listenAddr whose
// largest acceptable request body is maxRequest bytes; refused (nil: none)
// counts its refusals.
func newGuard(cfg GuardConfig, listenAddr string, maxRequest int64, refused func(string), log *slog.Logger) (*guard, error) {
	cfg = cfg.withDefaults()
	allowed, err := allowlist.New(cfg.AllowedHosts, cfg.AllowedOrigins, listenAddr)
	if err != nil {
		return nil, err
	}
	g := &guard{cfg: cfg, allowed: allowed, maxRequest: maxRequest, sockets: limit.NewCap(cfg.SocketsPerUser),
		log: log, refused: refused}
	if cfg.IPRate > 0 && cfg.IPBurst > 0 {
		g.ips = limit.NewRate(cfg.IPRate, cfg.IPBurst)
	}
	if cfg.UserRate > 0 && cfg.UserBurst > 0 {
		g.users = limit.NewRate(cfg.UserRate, cfg.UserBurst)
	}
	return g, nil
}

func (g *guard) count(reason string) {
	if g.refused != nil {
		g.refused(reason)
	}
}

// wrap applies the connection-level checks to every request, then next:
// Host allow-list (421); for the API and WebSocket routes the Origin
// allow-list (403), the per-IP rate limit (429), a declared body over the
// limit (413, nothing read, connection closed) and the body read deadline.
func (g *guard) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(g.cfg.TrustedProxies) > 0 {
			if client, ok := forwarded.Client(r, g.cfg.TrustedProxies); ok {
				// A copy: a handler must not change the server's Request.
				fr := new(http.Request)
				*fr = *r
				fr.RemoteAddr = netip.AddrPortFrom(client, 0).String()
				r = fr
			}
		}
		if r.Body != http.NoBody && r.Header.Get("Upgrade") == "" {
			// The server's idle and header timeouts do not cover the body:
			// bound its read from now. (The server resets the deadline for
			// the next request on the connection.) A request refused
			// below closes its connection: net/http would otherwise read
			// the unread body, however slowly it comes, before answering.
			_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(g.cfg.BodyReadTimeout))
			w = closeOnRefusal{w}
		}
		if !g.allowed.Host(r.Host) {
			g.count("host")
			writeJSON(w, http.StatusMisdirectedRequest, ErrorBody{Error: "host not allowed: this server does not answer for " + strconv.Quote(r.Host), Field: "Host"})
			return
		}
		if !strings.HasPrefix(r.URL.Path, "/api/") && r.URL.Path != "/ws" {
			next.ServeHTTP(w, r)
			return
		}
		if !g.allowed.Origin(r) {
			g.count("origin")
			writeJSON(w, http.StatusForbidden, ErrorBody{Error: "origin not allowed", Field: "Origin"})
			return
		}
		if !g.allow(w, g.ips, clientIP(r), "rate_ip") {
			return
		}
		if r.ContentLength > g.maxRequest {
			// Refused unread: the client may be about to trickle it.
			g.count("too_large")
			writeJSON(w, http.StatusRequestEntityTooLarge, ErrorBody{Error: fmt.Sprintf("request over %d bytes", g.maxRequest), Field: "body"})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// closeOnRefusal marks every answer of status 400 or more "Connection:
// close": the request's body may be unread.
type closeOnRefusal struct{ http.ResponseWriter }

func (c closeOnRefusal) WriteHeader(code int) {
	if code >= http.StatusBadRequest {
		c.Header().Set("Connection", "close")
	}
	c.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the connection.
func (c closeOnRefusal) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// limitUsers applies the per-user rate limit to the API and WebSocket
// routes; it runs after authentication (the user is the principal).
func (g *guard) limitUsers(next http.Handler) http.Handler {
	if g.users == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if (strings.HasPrefix(r.URL.Path, "/api/") || r.URL.Path == "/ws") && !g.allowUser(w, userOf(r)) {
			return
		}
		next.ServeHTTP(w, r)
	})
}

// allow takes one token of key's bucket in l; when there is none it writes
// 429 with Retry-After (whole seconds, at least 1), counts reason and
// reports false. A nil l allows everything.
func (g *guard) allow(w http.ResponseWriter, l *limit.Rate, key, reason string) bool {
	if l == nil {
		return true
	}
	wait := l.Reserve(key)
	if wait == 0 {
		return true
	}
	g.count(reason)
	w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
	writeJSON(w, http.StatusTooManyRequests, ErrorBody{Error: "too many requests: retry after " + w.Header().Get("Retry-After") + " s"})
	return false
}

// allowUser is the per-user limit: true, or 429 written.
func (g *guard) allowUser(w http.ResponseWriter, user string) bool {
	return g.allow(w, g.users, user, "rate_user")
}

// userSend reports whether user may send one more message now (a
// WebSocket send frame), and if not, how long to wait.
func (g *guard) userSend(user string) time.Duration {
	if g.users == nil {
		return 0
	}
	return g.users.Reserve(user)
}

// openSocket counts one more WebSocket of user; when the user is at the cap
// it writes 429 and returns ok false. Call release when the socket closes.
func (g *guard) openSocket(w http.ResponseWriter, user string) (release func(), ok bool) {
	release, ok = g.takeSocket(user)
	if !ok {
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusTooManyRequests, ErrorBody{Error: fmt.Sprintf("too many WebSockets: at most %d per user", g.cfg.SocketsPerUser)})
	}
	return release, ok
}

// takeSocket counts one more WebSocket of user unless the user is at the
// cap (then counted as refused, ok false). release is idempotent.
func (g *guard) takeSocket(user string) (release func(), ok bool) {
	release, ok = g.sockets.Take(user)
	if !ok {
		g.count("sockets")
	}
	return release, ok
}

// ParseTrustedProxies parses a comma-separated list of CIDRs and bare IPs
// ("10.0.0.0/8, 192.168.1.7, fd00::/8"; a bare IP is a /32 or /128) for
// GuardConfig.TrustedProxies; "" gives nil. Error: an element that is
// neither, naming it.
func ParseTrustedProxies(s string) ([]netip.Prefix, error) { return forwarded.ParsePrefixes(s) }

// clientIP is the request's client IP: its RemoteAddr, which guard.wrap
// set from X-Forwarded-For when the connecting address is a trusted proxy
// (GuardConfig.TrustedProxies); otherwise forwarded headers are ignored.
func clientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
