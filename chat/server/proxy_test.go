package server

import (
	"fmt"
	"net/http"
	"net/netip"
	"testing"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
)

// getXFF GETs a chat's history from base with the given X-Forwarded-For
// value ("" = none) and returns the status.
func getXFF(t *testing.T, base, xff string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, base+"/api/chats/1/messages", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+chattest.Token())
	if xff != "" {
		req.Header.Set("X-Forwarded-For", xff)
	}
	code, _, err := chattest.Answer(http.DefaultClient.Do(req))
	if err != nil {
		t.Fatal(err)
	}
	return code
}

// The per-IP rate limit reads X-Forwarded-For only from a trusted proxy:
// from an untrusted peer (the test's 127.0.0.1 outside --trusted-proxies)
// a new header value each time does not get past the limit; from a
// trusted one each client address has its own bucket, and a spoofed left
// part (what the client sent before the proxy appended its address) does
// not get past it either.
func TestTrustedProxiesForRateLimits(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	limited := func(trusted string) *running {
		return h.startAPI(chat.Consumers, func(c *Config) {
			// Two requests per IP, no refill within the test.
			c.API.Guard.IPRate, c.API.Guard.IPBurst = 0.001, 2
			tp, err := netip.ParsePrefix(trusted)
			if err != nil {
				t.Fatal(err)
			}
			c.API.Guard.TrustedProxies = []netip.Prefix{tp}
		})
	}

	untrusted := limited("10.0.0.0/8")
	for i := range 2 {
		if code := getXFF(t, untrusted.base, fmt.Sprintf("203.0.113.%d", i)); code != http.StatusOK {
			t.Fatalf("untrusted peer, request %d: %d", i, code)
		}
	}
	if code := getXFF(t, untrusted.base, "203.0.113.99"); code != http.StatusTooManyRequests {
		t.Fatalf("untrusted peer with a fresh X-Forwarded-For: %d, want 429 (the header is ignored)", code)
	}

	trusted := limited("127.0.0.1/32")
	for i := range 2 {
		if code := getXFF(t, trusted.base, "203.0.113.1"); code != http.StatusOK {
			t.Fatalf("trusted proxy, client .1, request %d: %d", i, code)
		}
	}
	if code := getXFF(t, trusted.base, "203.0.113.1"); code != http.StatusTooManyRequests {
		t.Fatalf("trusted proxy, client .1 over its limit: %d, want 429", code)
	}
	if code := getXFF(t, trusted.base, "203.0.113.2"); code != http.StatusOK {
		t.Fatalf("trusted proxy, another client: %d, want 200 (its own bucket)", code)
	}
	for i := range 3 {
		if code := getXFF(t, trusted.base, fmt.Sprintf("198.51.100.%d, 203.0.113.1", i)); code != http.StatusTooManyRequests {
			t.Fatalf("client .1 spoofing a left hop (%d): %d, want 429", i, code)
		}
	}
	// Without X-Forwarded-For the proxy's own address counts (its bucket
	// is still full).
	if code := getXFF(t, trusted.base, ""); code != http.StatusOK {
		t.Fatalf("trusted peer without the header: %d", code)
	}
}
