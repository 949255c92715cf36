package server

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/internal/testenv"
)

// refusedRaw sends request (raw HTTP) on a connection of its own to base,
// reads the answer within d and waits (5 s at most) for the server to
// close the connection.
func refusedRaw(t *testing.T, base, request string, d time.Duration) (*http.Response, []byte) {
	t.Helper()
	c := rawConn(t, base)
	fmt.Fprint(c, request)
	br := bufio.NewReader(c)
	resp, body := readResponse(t, c, br, d)
	waitClosed(t, c, br, 5*time.Second)
	return resp, body
}

// rawConn dials base ("http://host:port") over plain TCP.
func rawConn(t *testing.T, base string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// readResponse reads one HTTP response from c, failing after timeout.
func readResponse(t *testing.T, c net.Conn, br *bufio.Reader, timeout time.Duration) (*http.Response, []byte) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, body
}

// waitClosed fails unless the server closes c within timeout (after any
// bytes still in flight).
func waitClosed(t *testing.T, c net.Conn, br *bufio.Reader, timeout time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	_, err := io.Copy(io.Discard, br)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("connection still open after %v", timeout)
	}
}

// TestDeclaredSizeOverLimitIs413Unread sends a hostile request: a POST
// declaring Content-Length 1,000,000 and then nothing. The answer must be
// 413 at once, without waiting for a byte of the body, and the connection
// must close.
func TestDeclaredSizeOverLimitIs413Unread(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	cons := h.startAPI(chat.Consumers, nil)
	resp, body := refusedRaw(t, cons.base, fmt.Sprintf("POST /api/chats/1/messages HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n", strings.TrimPrefix(cons.base, "http://")), 5*time.Second)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !bytes.Contains(body, []byte(`"field":"body"`)) {
		t.Fatalf("got %d %s, want 413 naming the body", resp.StatusCode, body)
	}
	h.noMessagesStored(t)
}

// TestSlowBodyIsCut trickles bodies at 1 byte per second, on 100
// connections at once, each within the size limit: every one is answered
// 408 and closed once the body read timeout has passed, and nothing is
// stored.
func TestSlowBodyIsCut(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	const bodyTimeout = 2 * time.Second
	cons := h.startAPI(chat.Consumers, func(c *Config) {
		c.API.Guard.BodyReadTimeout = bodyTimeout
	})
	const conns = 100
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", strings.TrimPrefix(cons.base, "http://"))
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			start := time.Now()
			fmt.Fprintf(c, "POST /api/chats/1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n", chattest.Token())
			// The hostile client: one byte a second, in the background.
			stop := make(chan struct{})
			defer close(stop)
			go func() {
				tick := time.NewTicker(time.Second)
				defer tick.Stop()
				for {
					if _, err := c.Write([]byte("{")); err != nil {
						return
					}
					select {
					case <-stop:
						return
					case <-tick.C:
					}
				}
			}()
			_ = c.SetReadDeadline(time.Now().Add(4 * bodyTimeout))
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				errs <- fmt.Errorf("no answer: %v", err)
				return
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusRequestTimeout {
				errs <- fmt.Errorf("status %d, want 408", resp.StatusCode)
				return
			}
			if el := time.Since(start); el < bodyTimeout/2 {
				errs <- fmt.Errorf("cut after %v, before the timeout", el)
				return
			}
			if _, err := io.Copy(io.Discard, br); err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					errs <- errors.New("connection left open after the 408")
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// A refused request does not wait for its body either: net/http would
	// read the rest of it before answering unless the connection closes.
	resp, body := refusedRaw(t, cons.base, "POST /api/chats/1/messages HTTP/1.1\r\nHost: evil.example\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{", bodyTimeout/2)
	if resp.StatusCode != http.StatusMisdirectedRequest {
		t.Fatalf("wrong host: %d %s, want 421", resp.StatusCode, body)
	}
	h.noMessagesStored(t)
}

// TestIdleKeepAliveIsClosed: a keep-alive connection with no second
// request is closed after the idle timeout.
func TestIdleKeepAliveIsClosed(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	cons := h.startAPI(chat.Consumers, func(c *Config) {
		c.API.Guard.IdleTimeout = 300 * time.Millisecond
	})
	c := rawConn(t, cons.base)
	fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
	br := bufio.NewReader(c)
	if resp, body := readResponse(t, c, br, 5*time.Second); resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("healthz: %d close=%v %s", resp.StatusCode, resp.Close, body)
	}
	waitClosed(t, c, br, 5*time.Second)
}

// TestHostAndOriginAllowLists plays a DNS-rebinding page: its name
// (evil.example) now points at the server, so its requests carry Host and
// Origin of evil.example, which agree with each other. They are refused;
// the server's own names pass, and --allowed-origins admits a named
// third-party origin.
func TestHostAndOriginAllowLists(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	cons := h.startAPI(chat.Consumers, nil)
	port := cons.base[strings.LastIndex(cons.base, ":")+1:]
	other := h.startAPI(chat.Workers, func(c *Config) {
		c.API.Guard.AllowedOrigins = []string{"https://app.example"}
	})
	do := func(base, path, host, origin string, ws bool) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, base+path, nil)
		req.Host = host
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		if ws {
			req.Header.Set("Connection", "Upgrade")
			req.Header.Set("Upgrade", "websocket")
			req.Header.Set("Sec-WebSocket-Version", "13")
			req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
		}
		resp, err := chattest.AuthClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		name, base, path, host, origin string
		ws                             bool
		want                           int
	}{
		{"rebound page, history", cons.base, "/api/chats/1/messages", "evil.example:" + port, "http://evil.example:" + port, false, http.StatusMisdirectedRequest},
		{"rebound page, websocket", cons.base, "/ws?chat_id=1", "evil.example:" + port, "http://evil.example:" + port, true, http.StatusMisdirectedRequest},
		{"rebound page, chat page", cons.base, "/", "evil.example:" + port, "", false, http.StatusMisdirectedRequest},
		{"other site's page, websocket", cons.base, "/ws?chat_id=1", "127.0.0.1:" + port, "http://evil.example", true, http.StatusForbidden},
		{"other site's page, history", cons.base, "/api/chats/1/messages", "127.0.0.1:" + port, "http://evil.example", false, http.StatusForbidden},
		{"own page, websocket", cons.base, "/ws?chat_id=1", "127.0.0.1:" + port, "http://127.0.0.1:" + port, true, http.StatusSwitchingProtocols},
		{"localhost page, history", cons.base, "/api/chats/1/messages", "localhost:" + port, "http://localhost:" + port, false, http.StatusOK},
		{"no origin (not a browser)", cons.base, "/api/chats/1/messages", "127.0.0.1:" + port, "", false, http.StatusOK},
		{"allowed origin", other.base, "/api/chats/1/messages", "127.0.0.1", "https://app.example", false, http.StatusOK},
		{"own origin not in the list", other.base, "/api/chats/1/messages", "127.0.0.1", "http://127.0.0.1", false, http.StatusForbidden},
	} {
		if got := do(tc.base, tc.path, tc.host, tc.origin, tc.ws); got != tc.want {
			t.Errorf("%s: status %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestRateLimitsAndSocketCap: over the per-IP rate a request gets 429 with
// Retry-After; over the per-user socket cap a WebSocket gets 429.
func TestRateLimitsAndSocketCap(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	cons := h.startAPI(chat.Consumers, func(c *Config) {
		c.API.Guard.IPRate, c.API.Guard.IPBurst = 0.5, 3
		c.API.Guard.SocketsPerUser = 2
	})
	for i := range 4 {
		resp, err := chattest.AuthClient.Get(cons.base + "/api/chats/1/messages")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		want := http.StatusOK
		if i == 3 {
			want = http.StatusTooManyRequests
		}
		if resp.StatusCode != want {
			t.Fatalf("request %d: status %d, want %d", i+1, resp.StatusCode, want)
		}
		if i == 3 && resp.Header.Get("Retry-After") != "2" {
			t.Fatalf("Retry-After %q, want 2 (one token every 2 s)", resp.Header.Get("Retry-After"))
		}
	}

	work := h.startAPI(chat.Workers, func(c *Config) {
		c.API.Guard.IPRate = -1
		c.API.Guard.SocketsPerUser = 2
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dial := func() (*websocket.Conn, int) {
		c, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(work.base, "http")+"/ws?chat_id=1", chattest.WSOpts(chattest.Token()))
		if err != nil {
			if resp == nil {
				t.Fatal(err)
			}
			return nil, resp.StatusCode
		}
		return c, http.StatusSwitchingProtocols
	}
	a, _ := dial()
	b, _ := dial()
	if _, code := dial(); code != http.StatusTooManyRequests {
		t.Fatalf("third socket: status %d, want 429", code)
	}
	a.Close(websocket.StatusNormalClosure, "")
	testenv.WaitFor(t, 5*time.Second, "a socket freed after one closed", func() bool {
		c, code := dial()
		if c != nil {
			c.CloseNow()
		}
		return code == http.StatusSwitchingProtocols
	})
	b.CloseNow()
}

// TestSilentWebSocketIsDroppedLoggedCounted: a client that stops reading
// stops answering pings; it is dropped after the pong timeout, and the drop
// is logged and counted. A client that reads stays.
func TestSilentWebSocketIsDroppedLoggedCounted(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	var logs testenv.SyncBuffer
	cons := h.startAPI(chat.Consumers, func(c *Config) {
		c.API.Guard.PingInterval, c.API.Guard.PongTimeout = 100*time.Millisecond, 300*time.Millisecond
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	live := chattest.Watch(t, cons.base, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	silent, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(cons.base, "http")+"/ws?chat_id=3", chattest.WSOpts(chattest.Token()))
	if err != nil {
		t.Fatal(err)
	}
	defer silent.CloseNow()
	testenv.WaitFor(t, 10*time.Second, "the silent socket's drop counted", func() bool {
		m, err := chattest.Get(cons.base + "/metrics")
		return err == nil && strings.Contains(m, `outboxchat_ws_evictions_total{reason="ping_timeout"} 1`)
	})
	if !strings.Contains(logs.String(), `msg="websocket dropped" service=consumers reason=ping_timeout chat_id=3`) {
		t.Fatalf("no drop logged:\n%s", logs.String())
	}
	// The reading client answered every ping meanwhile and still gets
	// messages; it was not dropped.
	chattest.Send(t, cons.base, 3, "still here")
	live.WaitSeqs(t, chat.Consumers, 1, 10*time.Second)
	if m, _ := chattest.Get(cons.base + "/metrics"); !strings.Contains(m, `outboxchat_ws_evictions_total{reason="ping_timeout"} 1`) {
		t.Fatalf("drop count moved:\n%s", m)
	}
}
