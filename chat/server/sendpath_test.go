package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/httpapi"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/internal/testenv"
)

// postKeyed posts body to chat with an Idempotency-Key header (none when
// key is "") through client and returns the status and body.
func postKeyed(t testing.TB, client *http.Client, base string, chatN int64, key, body string) (int, []byte, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, fmt.Sprintf("%s/api/chats/%d/messages", base, chatN), strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	return chattest.Answer(client.Do(req))
}

func decodeMessage(t testing.TB, raw []byte) chat.Message {
	t.Helper()
	var m chat.Message
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("decode %s: %v", raw, err)
	}
	return m
}

// TestIdempotentSendHTTP: the same key and body → 200 with the first
// message; another body → 409 naming the key's field; client_id in the body
// works like the header, and a client_id that differs from the header is a
// 400; a WebSocket frame with a client_id already used stores nothing; the
// replay metric counts.
func TestIdempotentSendHTTP(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	cons := h.startAPI(chat.Consumers, nil)
	c := chattest.AuthClient

	code, raw, err := postKeyed(t, c, cons.base, 5, "k-1", `{"body":"hello"}`)
	if err != nil || code != http.StatusCreated {
		t.Fatalf("first send: %d %s %v", code, raw, err)
	}
	first := decodeMessage(t, raw)
	code, raw, err = postKeyed(t, c, cons.base, 5, "k-1", `{"body":"hello"}`)
	if err != nil || code != http.StatusOK {
		t.Fatalf("repeat: %d %s %v, want 200", code, raw, err)
	}
	if again := decodeMessage(t, raw); again.ID != first.ID || again.Seq != first.Seq || !again.SentAt.Equal(first.SentAt) {
		t.Fatalf("repeat answered %+v, first was %+v", again, first)
	}
	code, raw, _ = postKeyed(t, c, cons.base, 5, "k-1", `{"body":"something else"}`)
	var eb httpapi.ErrorBody
	if code != http.StatusConflict || json.Unmarshal(raw, &eb) != nil || eb.Field != "Idempotency-Key" {
		t.Fatalf("other body, same key: %d %s, want 409 naming Idempotency-Key", code, raw)
	}
	// The same key in another chat is another message.
	if code, raw, _ = postKeyed(t, c, cons.base, 6, "k-1", `{"body":"hello"}`); code != http.StatusCreated {
		t.Fatalf("same key, other chat: %d %s, want 201", code, raw)
	}
	// client_id in the body.
	if code, raw, _ = postKeyed(t, c, cons.base, 5, "", `{"body":"by body","client_id":"k-2"}`); code != http.StatusCreated {
		t.Fatalf("client_id send: %d %s", code, raw)
	}
	if code, raw, _ = postKeyed(t, c, cons.base, 5, "k-2", `{"body":"by body","client_id":"k-2"}`); code != http.StatusOK {
		t.Fatalf("client_id and the same header: %d %s, want 200", code, raw)
	}
	if code, raw, _ = postKeyed(t, c, cons.base, 5, "", `{"body":"other","client_id":"k-2"}`); code != http.StatusConflict ||
		!bytes.Contains(raw, []byte(`"field":"client_id"`)) {
		t.Fatalf("client_id reused with another body: %d %s, want 409 naming client_id", code, raw)
	}
	for _, bad := range []struct{ key, body, field string }{
		{"k-3", `{"body":"x","client_id":"k-4"}`, "client_id"},
		{strings.Repeat("k", 129), `{"body":"x"}`, "Idempotency-Key"},
		{"", `{"body":"x","client_id":""}`, "client_id"},
		{"", `{"body":"x","client_id":7}`, "client_id"},
	} {
		code, raw, _ := postKeyed(t, c, cons.base, 5, bad.key, bad.body)
		if code != http.StatusBadRequest || json.Unmarshal(raw, &eb) != nil || eb.Field != bad.field {
			t.Errorf("key %q body %s: %d %s, want 400 naming %s", bad.key, bad.body, code, raw, bad.field)
		}
	}
	// A WebSocket send frame with a used client_id stores nothing more.
	wsSend(t, cons.base, 5, func() bool {
		return h.Count(t, `SELECT count(*) FROM consumers.messages WHERE chat_id = 5 AND client_id = 'k-ws'`) == 1
	}, `{"body":"hello","client_id":"k-1"}`, `{"body":"over ws","client_id":"k-ws"}`)
	if n := h.Count(t, `SELECT count(*) FROM consumers.messages WHERE chat_id = 5`); n != 3 { // hello, by body, over ws
		t.Fatalf("%d messages in chat 5, want 3", n)
	}
	metrics, err := chattest.Get(cons.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"outboxchat_sends_replayed_total 3",
		`outboxchat_http_requests_total{code="409",route="POST /api/chats/{chat_id}/messages"} 2`,
		`outboxchat_http_requests_total{code="200",route="POST /api/chats/{chat_id}/messages"} 2`,
		"outboxchat_db_oldest_xmin_age_xids ", "outboxchat_db_oldest_transaction_seconds ",
		`outboxchat_http_request_duration_seconds_count{route="POST /api/chats/{chat_id}/messages"} 11`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// TestRetryAfterClientTimeoutStoresOnce: COMMIT is made slow (a deferred
// constraint trigger sleeping 2 s); a send whose client gives up after 1 s
// is still stored, and its retry with the same key gets 200 with that very
// message: one message in all.
func TestRetryAfterClientTimeoutStoresOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	ctx := context.Background()
	if _, err := h.Admin.Exec(ctx, `
		CREATE FUNCTION consumers.slow_commit() RETURNS trigger LANGUAGE plpgsql AS
			$$ BEGIN PERFORM pg_sleep(2); RETURN NULL; END $$;
		CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON consumers.messages
			DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION consumers.slow_commit()`); err != nil {
		t.Fatal(err)
	}
	cons := h.startAPI(chat.Consumers, func(c *Config) { c.API.SendLockTimeout = 10 * time.Second })
	impatient := &http.Client{Timeout: time.Second, Transport: chattest.BearerTransport{}}
	if code, raw, err := postKeyed(t, impatient, cons.base, 9, "retry-1", `{"body":"once"}`); err == nil {
		t.Fatalf("the first send answered within 1 s (%d %s): the slow commit did not apply", code, raw)
	}
	code, raw, err := postKeyed(t, &http.Client{Timeout: 20 * time.Second, Transport: chattest.BearerTransport{}}, cons.base, 9, "retry-1", `{"body":"once"}`)
	if err != nil || code != http.StatusOK {
		t.Fatalf("retry: %d %s %v, want 200 with the first message", code, raw, err)
	}
	m := decodeMessage(t, raw)
	var id string
	if err := h.Admin.QueryRow(ctx, `SELECT id::text FROM consumers.messages WHERE chat_id = 9`).Scan(&id); err != nil {
		t.Fatalf("exactly one message expected: %v", err)
	}
	if m.ID != id || m.Seq != 1 {
		t.Fatalf("retry answered %+v, stored id %s", m, id)
	}
}

// TestLockedChatHTTP: with chat 71's lock held by another session, sends
// to 72, 73 and 75 answer 201 while it is held; the send to 71 answers 503
// within the lock timeout with a short generic body, nothing stored, and
// the rejection is counted.
func TestLockedChatHTTP(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	cons := h.startAPI(chat.Consumers, func(c *Config) { c.API.SendLockTimeout = 500 * time.Millisecond })
	ctx := context.Background()
	tx := h.HoldChatLock(t, chat.Consumers, 71)
	defer tx.Rollback(ctx)
	type answer struct {
		code int
		raw  []byte
		took time.Duration
	}
	busy := make(chan answer, 1)
	go func() {
		start := time.Now()
		code, raw, _ := postKeyed(t, chattest.AuthClient, cons.base, 71, "", `{"body":"locked"}`)
		busy <- answer{code, raw, time.Since(start)}
	}()
	for _, c := range []int64{72, 73, 75} {
		if m := chattest.Send(t, cons.base, c, "free"); m.Seq != 1 {
			t.Fatalf("chat %d: %+v", c, m)
		}
	}
	a := <-busy
	var eb httpapi.ErrorBody
	if a.code != http.StatusServiceUnavailable || json.Unmarshal(a.raw, &eb) != nil || strings.Contains(eb.Error, "lock") ||
		strings.Contains(eb.Error, "ERROR") || strings.Contains(eb.Error, "SQLSTATE") {
		t.Fatalf("send to the locked chat: %d %s, want 503 with a generic body", a.code, a.raw)
	}
	t.Logf("locked chat answered %d after %v: %s", a.code, a.took, bytes.TrimSpace(a.raw))
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := h.Count(t, `SELECT count(*) FROM consumers.messages WHERE chat_id = 71`); n != 0 {
		t.Fatalf("%d messages stored in the locked chat", n)
	}
	if m, err := chattest.Get(cons.base + "/metrics"); err != nil || !strings.Contains(m, `outboxchat_sends_rejected_total{reason="lock_timeout"} 1`) {
		t.Errorf("rejection not counted (%v)", err)
	}
}

// TestHistoryTimeout: with consumers.messages locked by another session,
// a history read answers 503 after the read timeout with a short generic
// body (no driver or SQL text).
func TestHistoryTimeout(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	cons := h.startAPI(chat.Consumers, func(c *Config) { c.API.ReadTimeout = time.Second })
	ctx := context.Background()
	tx := h.lockMessages(t)
	code, raw, err := chattest.Answer((&http.Client{Timeout: 20 * time.Second, Transport: chattest.BearerTransport{}}).Get(cons.base + "/api/chats/1/messages"))
	if err != nil {
		t.Fatal(err)
	}
	if code != http.StatusServiceUnavailable || string(bytes.TrimSpace(raw)) != `{"error":"timed out reading the chat","field":""}` {
		t.Fatalf("history with the table locked: %d %s, want 503 and a generic body", code, raw)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// Served again once the lock is gone (retried: on a loaded machine one
	// read may itself take longer than the short read timeout).
	testenv.WaitFor(t, 10*time.Second, "history served after the lock", func() bool {
		_, err := chattest.Get(cons.base + "/api/chats/1/messages")
		return err == nil
	})
}

// TestPoolMaxConnsHonoured: pool_max_conns=2 in the database URL caps the
// service's pool at 2: six history reads held back by a table lock occupy
// at most 2 backends of the service's role (with the old floor of 16 all
// six would wait in backends of their own). LISTEN connections, opened
// outside the pool, are not counted.
func TestPoolMaxConnsHonoured(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	cons := h.startAPI(chat.Consumers, func(c *Config) {
		c.DatabaseURL += "&pool_max_conns=2"
		if !strings.Contains(c.DatabaseURL, "?") {
			c.DatabaseURL = strings.Replace(c.DatabaseURL, "&", "?", 1)
		}
		c.API.ReadTimeout = 3 * time.Second
	})
	ctx := context.Background()
	tx := h.lockMessages(t)
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			if resp, err := chattest.AuthClient.Get(cons.base + "/api/chats/1/messages"); err == nil {
				resp.Body.Close()
			}
		})
	}
	waiting := func() int {
		return h.Count(t, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND usename = 'consumers' AND wait_event_type = 'Lock'`)
	}
	testenv.WaitFor(t, 10*time.Second, "two reads waiting on the lock", func() bool { return waiting() >= 2 })
	most := 0
	for range 20 { // the reads wait 3 s: sample while they do
		most = max(most, waiting())
	}
	pooled := h.Count(t, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND usename = 'consumers' AND application_name NOT IN ('outboxchat-gateway', 'outbox_relay_listen', 'outboxchat_listen')`)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if most != 2 || pooled > 2 {
		t.Fatalf("%d backends waited at once and %d pooled connections were open, want 2 and at most 2", most, pooled)
	}
}

// wsSend opens a WebSocket on chat, sends frames (the server handles a
// connection's sends one after another), waits until done holds and closes
// it (closing earlier would cancel sends still queued).
func wsSend(t testing.TB, base string, chatN int64, done func() bool, frames ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, fmt.Sprintf("ws%s/ws?chat_id=%d", base[len("http"):], chatN), chattest.WSOpts(chattest.Token()))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.CloseNow()
	for _, f := range frames {
		if err := c.Write(ctx, websocket.MessageText, []byte(f)); err != nil {
			t.Fatalf("write %s: %v", f, err)
		}
	}
	testenv.WaitFor(t, 10*time.Second, "the WebSocket sends handled", done)
}

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
	// A connection the service began before the REVOKE may still finish
	// logging in: terminate until none is left.
	testenv.WaitFor(t, 10*time.Second, "no consumers backend left", func() bool {
		var left int
		if err := h.Admin.QueryRow(t.Context(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = 'consumers' AND datname = current_database()`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		return left == 0
	})
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
