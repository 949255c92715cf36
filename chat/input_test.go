package chat

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// Bad input at the HTTP API: every case gets 400 with a JSON error naming the
// field, and nothing is stored (no message, no outbox row).
func TestBadInputIsRejectedAndNothingStored(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	cons := h.start(Consumers, func(c *Config) { c.Roles = []string{RoleAPI} })
	cases := []struct {
		name, chat, body, field string
	}{
		{"chat id zero", "0", `{"body":"x"}`, "chat_id"},
		{"chat id negative", "-1", `{"body":"x"}`, "chat_id"},
		{"chat id not a number", "abc", `{"body":"x"}`, "chat_id"},
		{"chat id over int64", "9223372036854775808", `{"body":"x"}`, "chat_id"},
		{"chat id leading zero", "01", `{"body":"x"}`, "chat_id"},
		{"empty body", "1", `{"body":""}`, "body"},
		{"missing body", "1", `{}`, "body"},
		{"body too long", "1", `{"body":"` + strings.Repeat("a", DefaultMaxBodyBytes+1) + `"}`, "body"},
		{"body multibyte too long", "1", `{"body":"` + strings.Repeat("é", DefaultMaxBodyBytes/2+1) + `"}`, "body"},
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
		code, raw := post(t, cons.base, c.chat, c.body)
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
	for _, table := range []string{"consumers.messages", "consumers.outbox"} {
		if n := h.count(t, "SELECT count(*) FROM "+table); n != 0 {
			t.Errorf("%s has %d rows after rejected requests, want 0", table, n)
		}
	}
	// Not JSON by Content-Type: 415; too large: 413. Nothing stored either.
	for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", ""} {
		req, _ := http.NewRequest(http.MethodPost, cons.base+"/api/chats/1/messages", strings.NewReader(`{"body":"x"}`))
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		resp, err := authClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnsupportedMediaType {
			t.Errorf("Content-Type %q: status %d, want 415", ct, resp.StatusCode)
		}
	}
	if code, raw := post(t, cons.base, "1", `{"body":"`+strings.Repeat("a", 1<<20)+`"}`); code != http.StatusRequestEntityTooLarge {
		t.Errorf("1 MiB request: %d %s, want 413", code, raw)
	}
	for _, table := range []string{"consumers.messages", "consumers.outbox"} {
		if n := h.count(t, "SELECT count(*) FROM "+table); n != 0 {
			t.Errorf("%s has %d rows after refused requests, want 0", table, n)
		}
	}
	// Bad query parameters.
	for _, u := range []string{"/api/chats/1/messages?after_seq=-1", "/api/chats/1/messages?after_seq=x", "/api/chats/1/messages?limit=0", "/ws?chat_id=0"} {
		resp, err := authClient.Get(cons.base + u)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("GET %s: status %d, want 400", u, resp.StatusCode)
		}
	}
	// The limit is exactly inclusive.
	if code, raw := post(t, cons.base, "1", `{"body":"`+strings.Repeat("a", DefaultMaxBodyBytes)+`"}`); code != http.StatusCreated {
		t.Fatalf("body of exactly the limit: %d %s", code, raw)
	}
}

// Postgres down: the API answers 503 with a JSON error and writes nothing.
func TestDatabaseDownIs503(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	cons := h.start(Consumers, func(c *Config) { c.Roles = []string{RoleAPI} })
	// A WebSocket opened while the database is there, to send on after.
	wctx, wcancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer wcancel()
	ws, _, err := websocket.Dial(wctx, "ws"+strings.TrimPrefix(cons.base, "http")+"/ws?chat_id=1", wsOpts(testToken()))
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	// Take the database away from under the service by revoking its login.
	if _, err := h.admin.Exec(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'consumers' AND datname = current_database()`); err != nil {
		t.Fatal(err)
	}
	if _, err := h.admin.Exec(t.Context(), `REVOKE CONNECT ON DATABASE `+currentDB(t, h)+` FROM PUBLIC, consumers`); err != nil {
		t.Fatal(err)
	}
	if _, err := h.admin.Exec(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'consumers' AND datname = current_database()`); err != nil {
		t.Fatal(err)
	}
	code, raw := post(t, cons.base, "1", `{"body":"x"}`)
	if code != http.StatusServiceUnavailable || !strings.Contains(string(raw), `"error"`) {
		t.Fatalf("send with the database gone: %d %s, want 503 with a JSON error", code, raw)
	}
	if n := h.count(t, "SELECT count(*) FROM consumers.messages"); n != 0 {
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
		var e errorBody
		if json.Unmarshal(frame, &e) != nil || e.Error == "" {
			continue // a message frame
		}
		if !strings.Contains(e.Error, "could not store") || strings.Contains(e.Error, "SQLSTATE") || strings.Contains(e.Error, "permission denied") {
			t.Errorf("WebSocket send with the database gone: frame %s", frame)
		}
		break
	}
	if n := h.count(t, "SELECT count(*) FROM consumers.messages"); n != 0 {
		t.Fatalf("%d messages stored", n)
	}
}

func currentDB(t *testing.T, h *harness) string {
	var db string
	if err := h.admin.QueryRow(t.Context(), `SELECT quote_ident(current_database())`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	return db
}

func TestDecodeSendRequest(t *testing.T) {
	t.Parallel()
	req, err := DecodeSendRequest([]byte(`{"body":"héllo"}`), 0)
	if err != nil || req.Body != "héllo" {
		t.Fatalf("got %+v, %v", req, err)
	}
	_, err = DecodeSendRequest([]byte(`{"body":"abcdef"}`), 5)
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "body" {
		t.Fatalf("over a 5-byte limit: %v, want a body FieldError", err)
	}
}

func TestDecodeEvent(t *testing.T) {
	t.Parallel()
	good := `{"id":"0b5c6f5e-5d2e-4b8a-9f53-1d2e3f4a5b6c","chat_id":3,"seq":2,"body":"hi","sent_at":"2026-11-30T07:00:00.123456Z","from":"consumers","extra":{"grows":true}}`
	m, err := DecodeEvent([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if m.ChatID != 3 || m.Seq != 2 || m.Body != "hi" || m.From != Consumers || m.SentAt.Nanosecond() != 123456000 {
		t.Fatalf("decoded %+v", m)
	}
	bad := map[string]string{
		"not json":      `{`,
		"id not uuid":   strings.Replace(good, "0b5c6f5e-5d2e-4b8a-9f53-1d2e3f4a5b6c", "x", 1),
		"chat id zero":  strings.Replace(good, `"chat_id":3`, `"chat_id":0`, 1),
		"seq missing":   strings.Replace(good, `"seq":2,`, ``, 1),
		"body missing":  strings.Replace(good, `"body":"hi",`, ``, 1),
		"body empty":    strings.Replace(good, `"body":"hi"`, `"body":""`, 1),
		"bad time":      strings.Replace(good, `2026-11-30T07:00:00.123456Z`, `yesterday`, 1),
		"unknown from":  strings.Replace(good, `"from":"consumers"`, `"from":"mallory"`, 1),
		"chat id float": strings.Replace(good, `"chat_id":3`, `"chat_id":3.5`, 1),
	}
	for name, in := range bad {
		if _, err := DecodeEvent([]byte(in)); !errors.Is(err, ErrMalformedEvent) {
			t.Errorf("%s: err %v, want ErrMalformedEvent", name, err)
		}
	}
}

func TestMessageJSONRoundTrip(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 30, 7, 0, 0, 123456789, time.UTC)
	m := Message{ID: "0b5c6f5e-5d2e-4b8a-9f53-1d2e3f4a5b6c", ChatID: 1, Seq: 1, Body: "x", SentAt: at, From: Workers}
	b, _ := json.Marshal(m)
	if !strings.Contains(string(b), `"sent_at":"2026-11-30T07:00:00.123456Z"`) || strings.Contains(string(b), "received_at") {
		t.Fatalf("encoded %s", b)
	}
	back, err := DecodeEvent(b)
	if err != nil || !back.SentAt.Equal(at.Truncate(time.Microsecond)) {
		t.Fatalf("round trip: %+v %v", back, err)
	}
}

func FuzzDecodeSendRequest(f *testing.F) {
	for _, s := range []string{`{"body":"x"}`, `{"body":""}`, `{}`, `{"body":"a\u0000"}`, "{\"body\":\"\xff\"}", `[1]`, `{"body":"x","y":1}`, `{"body":"x"} {}`, `{"body":"\ud83d\ude00"}`, `{"body":"\ud800"}`, `{"Body":"x"}`, `{"body":"a","body":"b"}`, `{"body":"\\u0041"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := DecodeSendRequest(data, 64)
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("error %v is not a *FieldError", err)
			}
			return
		}
		if ValidateBody(req.Body, 64) != nil {
			t.Fatalf("accepted an invalid body %q", req.Body)
		}
		if hasUnpairedSurrogate(data) {
			t.Fatalf("accepted %q with an unpaired surrogate", data)
		}
	})
}

func FuzzDecodeEvent(f *testing.F) {
	f.Add([]byte(`{"id":"0b5c6f5e-5d2e-4b8a-9f53-1d2e3f4a5b6c","chat_id":3,"seq":2,"body":"hi","sent_at":"2026-11-30T07:00:00.123456Z","from":"consumers"}`))
	f.Add([]byte(`{"id":"","chat_id":-1}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := DecodeEvent(data)
		if err != nil {
			if !errors.Is(err, ErrMalformedEvent) {
				t.Fatalf("error %v does not wrap ErrMalformedEvent", err)
			}
			return
		}
		if m.ChatID <= 0 || m.Seq <= 0 || Peer(m.From) == "" || ValidateBody(m.Body, 1<<20) != nil {
			t.Fatalf("accepted an invalid event %+v", m)
		}
	})
}

func TestHasUnpairedSurrogate(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]bool{
		`{"body":"x"}`:                  false,
		`{"body":"\ud83d\ude00"}`:       false, // a pair: 😀
		`{"body":"\ud83d"}`:             true,
		`{"body":"\ude00"}`:             true,
		`{"body":"\ud83dx"}`:            true,
		`{"body":"\ud83d\n"}`:           true,
		`{"body":"\\ud83d"}`:            false, // an escaped backslash, then text
		`{"body":"\ufffd\ud800"}`:       true,
		`{"body":"\ud83d\ud83d\ude00"}`: true,
	} {
		if got := hasUnpairedSurrogate([]byte(in)); got != want {
			t.Errorf("hasUnpairedSurrogate(%s) = %v, want %v", in, got, want)
		}
	}
}
