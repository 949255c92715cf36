package server

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/httpapi"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
)

// errorAnswer does req and returns the status, the Content-Type and the
// decoded {"error", "field"} body; it fails the test when the body is not
// that JSON shape with a non-empty error.
func errorAnswer(t *testing.T, req *http.Request) (code int, resp *http.Response, e httpapi.ErrorBody) {
	t.Helper()
	resp, err := chattest.AuthClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("%s %s: %d body %q is not JSON", req.Method, req.URL.Path, resp.StatusCode, raw)
	}
	if _, ok := m["field"]; !ok {
		t.Fatalf("%s %s: %d body %s has no \"field\"", req.Method, req.URL.Path, resp.StatusCode, raw)
	}
	if err := json.Unmarshal(raw, &e); err != nil || e.Error == "" {
		t.Fatalf("%s %s: %d body %s is not {\"error\", \"field\"}", req.Method, req.URL.Path, resp.StatusCode, raw)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: Content-Type %q, want application/json", req.Method, req.URL.Path, ct)
	}
	return resp.StatusCode, resp, e
}

// Routes the API does not have, and methods a route does not take, are
// answered in the same JSON shape as every other error; the page, the
// health checks and the API still answer as before.
func TestUnknownRoutesAndMethodsAnswerJSON(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	cons := h.startAPI(chat.Consumers, nil)
	cases := []struct {
		method, path string
		code         int
		allow        string
	}{
		{"GET", "/nope", http.StatusNotFound, ""},
		{"GET", "/api/chats/1", http.StatusNotFound, ""},
		{"POST", "/", http.StatusMethodNotAllowed, "GET, HEAD"},
		{"DELETE", "/api/chats/1/messages", http.StatusMethodNotAllowed, "GET, HEAD, POST"},
		{"PUT", "/healthz", http.StatusMethodNotAllowed, "GET, HEAD"},
	}
	for _, c := range cases {
		req, _ := http.NewRequest(c.method, cons.base+c.path, nil)
		code, resp, e := errorAnswer(t, req)
		if code != c.code {
			t.Errorf("%s %s: status %d (%q), want %d", c.method, c.path, code, e.Error, c.code)
		}
		if e.Field != "" || !strings.Contains(e.Error, c.path) {
			t.Errorf("%s %s: error %+v, want one naming the path and no field", c.method, c.path, e)
		}
		if got := resp.Header.Get("Allow"); got != c.allow {
			t.Errorf("%s %s: Allow %q, want %q", c.method, c.path, got, c.allow)
		}
	}
	for path, want := range map[string]string{"/": "text/html; charset=utf-8", "/healthz": "application/json"} {
		resp, err := http.Get(cons.base + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != want {
			t.Errorf("GET %s: %d %q, want 200 %q", path, resp.StatusCode, resp.Header.Get("Content-Type"), want)
		}
	}
	if code, raw := chattest.Post(t, cons.base, "1", `{"body":"still works"}`); code != http.StatusCreated {
		t.Fatalf("send through the wrapped mux: %d %s", code, raw)
	}
}

// A refused WebSocket handshake is a JSON error naming the header at fault.
func TestWebSocketHandshakeErrorsAnswerJSON(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	cons := h.startAPI(chat.Consumers, nil)
	cases := []struct {
		name   string
		header map[string]string
		code   int
		field  string
	}{
		{"plain GET", nil, http.StatusUpgradeRequired, "Connection"},
		{"no Upgrade", map[string]string{"Connection": "Upgrade"}, http.StatusUpgradeRequired, "Upgrade"},
		{"bad version", map[string]string{"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "8"}, http.StatusBadRequest, "Sec-WebSocket-Version"},
		{"no key", map[string]string{"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13"}, http.StatusBadRequest, "Sec-WebSocket-Key"},
		{"other site", map[string]string{"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
			"Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Origin": "https://evil.example"}, http.StatusForbidden, "Origin"},
	}
	for _, c := range cases {
		req, _ := http.NewRequest("GET", cons.base+"/ws?chat_id=1", nil)
		for k, v := range c.header {
			req.Header.Set(k, v)
		}
		code, _, e := errorAnswer(t, req)
		if code != c.code || e.Field != c.field {
			t.Errorf("%s: %d %+v, want %d naming %s", c.name, code, e, c.code, c.field)
		}
	}
	// Bad query parameters were JSON already and stay so.
	req, _ := http.NewRequest("GET", cons.base+"/ws?chat_id=0", nil)
	if code, _, e := errorAnswer(t, req); code != http.StatusBadRequest || e.Field != "chat_id" {
		t.Errorf("chat_id=0: %d %+v", code, e)
	}
}
