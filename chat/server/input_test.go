package server

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/httpapi"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
)

// Bad input at the HTTP API: every case gets 400 with a JSON error naming the
// field, and nothing is stored (no message, no outbox row).
func TestBadInputIsRejectedAndNothingStored(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	cons := h.startAPI(chat.Consumers, nil)
	cases := []struct {
		name, chatN, body, field string
	}{
		{"chat id zero", "0", `{"body":"x"}`, "chat_id"},
		{"chat id negative", "-1", `{"body":"x"}`, "chat_id"},
		{"chat id not a number", "abc", `{"body":"x"}`, "chat_id"},
		{"chat id over int64", "9223372036854775808", `{"body":"x"}`, "chat_id"},
		{"chat id leading zero", "01", `{"body":"x"}`, "chat_id"},
		{"empty body", "1", `{"body":""}`, "body"},
		{"missing body", "1", `{}`, "body"},
		{"body too long", "1", `{"body":"` + strings.Repeat("a", chat.DefaultMaxBodyBytes+1) + `"}`, "body"},
		{"body multibyte too long", "1", `{"body":"` + strings.Repeat("é", chat.DefaultMaxBodyBytes/2+1) + `"}`, "body"},
		{"invalid utf-8", "1", "{\"body\":\"\xff\xfe\"}", "body"},
		{"escaped NUL", "1", `{"body":"a\u0000b"}`, "body"},
		{"lone surrogate", "1", `{"body":"\ud800"}`, "body"},
		{"malformed json", "1", `{"body":`, ""},
		{"not an object", "1", `["x"]`, ""},
		{"body not a string", "1", `{"body":5}`, "body"},
		{"unknown field", "1", `{"body":"x","chat":2}`, "chat"},
		{"two documents", "1", `{"body":"x"}{"body":"y"}`, ""},
		{"empty request", "1", ``, ""},
		{"key in another case", "1", `{"Body":"x"}`, "Body"},
		{"key twice", "1", `{"body":"a","body":"b"}`, "body"},
		{"key twice, other case", "1", `{"body":"a","BODY":"b"}`, "BODY"},
		{"blank body", "1", `{"body":"  \n\t "}`, "body"},
		{"surrogate after U+FFFD", "1", `{"body":"\ufffd\ud800"}`, "body"},
		{"low surrogate alone", "1", `{"body":"a\udc00"}`, "body"},
		{"null body", "1", `{"body":null}`, "body"},
	}
	for _, c := range cases {
		code, raw := chattest.Post(t, cons.base, c.chatN, c.body)
		if code != http.StatusBadRequest {
			t.Errorf("%s: status %d (%s), want 400", c.name, code, raw)
			continue
		}
		var e struct {
			Error string `json:"error"`
			Field string `json:"field"`
		}
		if err := json.Unmarshal(raw, &e); err != nil || e.Error == "" {
			t.Errorf("%s: body %q is not a JSON error", c.name, raw)
			continue
		}
		if !strings.Contains(string(raw), `"field":`) {
			t.Errorf("%s: %s has no field key", c.name, raw)
		}
		if e.Field != c.field {
			t.Errorf("%s: field %q, want %q (%s)", c.name, e.Field, c.field, e.Error)
		}
	}
	nothingStored(t, h, "rejected")
	// Not JSON by Content-Type: 415; too large: 413. Nothing stored either.
	for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", ""} {
		req, _ := http.NewRequest(http.MethodPost, cons.base+"/api/chats/1/messages", strings.NewReader(`{"body":"x"}`))
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		if code := statusOf(t, req); code != http.StatusUnsupportedMediaType {
			t.Errorf("Content-Type %q: status %d, want 415", ct, code)
		}
	}
	if code, raw := chattest.Post(t, cons.base, "1", `{"body":"`+strings.Repeat("a", 1<<20)+`"}`); code != http.StatusRequestEntityTooLarge {
		t.Errorf("1 MiB request: %d %s, want 413", code, raw)
	}
	nothingStored(t, h, "refused")
	// Bad query parameters.
	for _, u := range []string{"/api/chats/1/messages?after_seq=-1", "/api/chats/1/messages?after_seq=x", "/api/chats/1/messages?limit=0", "/ws?chat_id=0"} {
		req, _ := http.NewRequest(http.MethodGet, cons.base+u, nil)
		if code := statusOf(t, req); code != http.StatusBadRequest {
			t.Errorf("GET %s: status %d, want 400", u, code)
		}
	}
	// The limit is exactly inclusive.
	if code, raw := chattest.Post(t, cons.base, "1", `{"body":"`+strings.Repeat("a", chat.DefaultMaxBodyBytes)+`"}`); code != http.StatusCreated {
		t.Fatalf("body of exactly the limit: %d %s", code, raw)
	}
}

// Postgres down: the API answers 503 with a JSON error and writes nothing.
func TestDatabaseDownIs503(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	cons := h.startAPI(chat.Consumers, nil)
	// A WebSocket opened while the database is there, to send on after.
	wctx, wcancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer wcancel()
	ws, _, err := websocket.Dial(wctx, "ws"+strings.TrimPrefix(cons.base, "http")+"/ws?chat_id=1", chattest.WSOpts(chattest.Token()))
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	// Take the database away from under the service by revoking its login.
	if _, err := h.Admin.Exec(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'consumers' AND datname = current_database()`); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Admin.Exec(t.Context(), `REVOKE CONNECT ON DATABASE `+currentDB(t, h)+` FROM PUBLIC, consumers`); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Admin.Exec(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'consumers' AND datname = current_database()`); err != nil {
		t.Fatal(err)
	}
	code, raw := chattest.Post(t, cons.base, "1", `{"body":"x"}`)
	if code != http.StatusServiceUnavailable || !strings.Contains(string(raw), `"error"`) {
		t.Fatalf("send with the database gone: %d %s, want 503 with a JSON error", code, raw)
	}
	if n := h.Count(t, "SELECT count(*) FROM consumers.messages"); n != 0 {
		t.Fatalf("%d messages stored", n)
	}
	// A read says the database is unavailable, and nothing about storing;
	// no driver text in either body.
	for _, u := range []string{"/api/chats/1/messages", "/readyz"} {
		req, _ := http.NewRequest("GET", cons.base+u, nil)
		code, _, e := errorAnswer(t, req)
		if code != http.StatusServiceUnavailable || !strings.Contains(e.Error, "database unavailable") || strings.Contains(e.Error, "stored") {
			t.Errorf("GET %s with the database gone: %d %+v, want 503 \"database unavailable\" without a word on storing", u, code, e)
		}
	}
	if s := string(raw); strings.Contains(s, "SQLSTATE") || strings.Contains(s, "FATAL") || strings.Contains(s, "permission denied") {
		t.Errorf("driver text in the send's answer: %s", s)
	}
	// The same send over the WebSocket: an error frame, same shape, no
	// driver text.
	if err := ws.Write(wctx, websocket.MessageText, []byte(`{"body":"x"}`)); err != nil {
		t.Fatal(err)
	}
	for {
		_, frame, err := ws.Read(wctx)
		if err != nil {
			t.Fatalf("no error frame for a send with the database gone: %v", err)
		}
		var e httpapi.ErrorBody
		if json.Unmarshal(frame, &e) != nil || e.Error == "" {
			continue // a message frame
		}
		if !strings.Contains(e.Error, "could not store") || strings.Contains(e.Error, "SQLSTATE") || strings.Contains(e.Error, "permission denied") {
			t.Errorf("WebSocket send with the database gone: frame %s", frame)
		}
		break
	}
	if n := h.Count(t, "SELECT count(*) FROM consumers.messages"); n != 0 {
		t.Fatalf("%d messages stored", n)
	}
}

func currentDB(t *testing.T, h *harness) string {
	var db string
	if err := h.Admin.QueryRow(t.Context(), `SELECT quote_ident(current_database())`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	return db
}

// statusOf sends req with the test token and returns the answer's status.
func statusOf(t *testing.T, req *http.Request) int {
	t.Helper()
	resp, err := chattest.AuthClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// nothingStored marks the test failed if consumers.messages or
// consumers.outbox holds a row after the requests refused as how.
func nothingStored(t *testing.T, h *harness, how string) {
	t.Helper()
	for _, table := range []string{"consumers.messages", "consumers.outbox"} {
		if n := h.Count(t, "SELECT count(*) FROM "+table); n != 0 {
			t.Errorf("%s has %d rows after %s requests, want 0", table, n, how)
		}
	}
}
