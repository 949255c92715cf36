package server

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/golang-jwt/jwt/v5"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/auth"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/internal/testenv"
)

// do sends method to u with token as bearer ("" = none) and returns the
// status and body.
func do(t *testing.T, method, u, token, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	code, raw, err := chattest.Answer(http.DefaultClient.Do(req))
	if err != nil {
		t.Fatal(err)
	}
	return code, raw
}

func mint(t *testing.T, user string, svc []string, chats auth.ChatScope, ttl time.Duration) string {
	t.Helper()
	tok, err := auth.MintToken(chattest.Secret, user, svc, chats, ttl)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// wsCloseCode reads c until it closes and returns the close code.
func wsCloseCode(t *testing.T, ctx context.Context, c *websocket.Conn) websocket.StatusCode {
	t.Helper()
	for {
		if _, _, err := c.Read(ctx); err != nil {
			if ctx.Err() != nil {
				t.Fatalf("socket still open: %v", err)
			}
			return websocket.CloseStatus(err)
		}
	}
}

// TestAuthAnswers checks every answer of the auth contract against running
// services: 401 without a valid token for this service, 403 (nothing
// stored) for a chat outside the claim, tokens never read from the query
// string, the WebSocket's two ways to present a token, 4401 at expiry, and
// the author carried to history, frames and the peer's inbox.
func TestAuthAnswers(t *testing.T) {
	t.Parallel()
	h, cons, work := startBoth(t)
	both := []string{chat.Consumers, chat.Workers}
	alice := mint(t, "alice", both, auth.ChatScope{IDs: []int64{1, 2}}, time.Hour)
	msgs := cons.base + "/api/chats/1/messages"

	otherSecret, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"sub": "mallory", "chats": "*", "svc": both, "exp": time.Now().Add(time.Hour).Unix(),
	}).SignedString([]byte("not the service's secret, but 32 bytes long"))
	if err != nil {
		t.Fatal(err)
	}
	noExp, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "x", "chats": "*", "svc": both}).SignedString(chattest.Secret)
	unsigned, _ := jwt.NewWithClaims(jwt.SigningMethodNone, jwt.MapClaims{
		"sub": "x", "chats": "*", "svc": both, "exp": time.Now().Add(time.Hour).Unix(),
	}).SignedString(jwt.UnsafeAllowNoneSignatureType)
	for _, tc := range []struct{ name, token string }{
		{"no token", ""},
		{"garbage", "not.a.jwt"},
		{"another secret", otherSecret},
		{"alg none", unsigned},
		{"no exp", noExp},
		{"expired", mint(t, "alice", both, auth.ChatScope{All: true}, time.Nanosecond)},
		{"for workers only", mint(t, "alice", []string{chat.Workers}, auth.ChatScope{All: true}, time.Hour)},
	} {
		code, raw := do(t, http.MethodPost, msgs, tc.token, `{"body":"x"}`)
		if code != http.StatusUnauthorized || !bytes.Contains(raw, []byte(`"field":"Authorization"`)) {
			t.Errorf("%s: POST %d %s, want 401", tc.name, code, raw)
		}
		if code, _ := do(t, http.MethodGet, msgs, tc.token, ""); code != http.StatusUnauthorized {
			t.Errorf("%s: GET %d, want 401", tc.name, code)
		}
	}
	// A token in the query string is not read.
	if code, _ := do(t, http.MethodGet, msgs+"?token="+alice, "", ""); code != http.StatusUnauthorized {
		t.Errorf("token in the query string: %d, want 401", code)
	}
	// A chat outside the claim: 403, nothing stored.
	if code, raw := do(t, http.MethodPost, cons.base+"/api/chats/3/messages", alice, `{"body":"x"}`); code != http.StatusForbidden || !bytes.Contains(raw, []byte(`"field":"chat_id"`)) {
		t.Errorf("chat 3: POST %d %s, want 403", code, raw)
	}
	if code, _ := do(t, http.MethodGet, cons.base+"/api/chats/3/messages", alice, ""); code != http.StatusForbidden {
		t.Errorf("chat 3: GET %d, want 403", code)
	}
	for _, table := range []string{"consumers.messages", "consumers.outbox"} {
		if n := h.Count(t, "SELECT count(*) FROM "+table); n != 0 {
			t.Fatalf("%s has %d rows after refused requests", table, n)
		}
	}

	// WebSockets.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	wsURL := func(base string, chatN int) string {
		return "ws" + strings.TrimPrefix(base, "http") + "/ws?chat_id=" + string(rune('0'+chatN))
	}
	if _, resp, err := websocket.Dial(ctx, wsURL(work.base, 3), chattest.WSOpts(alice)); err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("socket on chat 3: %v %v, want 403", err, resp)
	}
	if _, resp, err := websocket.Dial(ctx, wsURL(work.base, 1), chattest.WSOpts(otherSecret)); err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("socket with a forged token: %v %v, want 401", err, resp)
	}
	// No token in the upgrade (one in the query string is ignored): the
	// first frame must be the token.
	c, _, err := websocket.Dial(ctx, wsURL(work.base, 1)+"&token="+alice, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Write(ctx, websocket.MessageText, []byte(`{"body":"hi"}`))
	if code := wsCloseCode(t, ctx, c); code != chat.CloseUnauthorized {
		t.Errorf("first frame not a token: close %d, want 4401", code)
	}
	c, _, err = websocket.Dial(ctx, wsURL(work.base, 3), nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Write(ctx, websocket.MessageText, []byte(`{"token":"`+alice+`"}`))
	if code := wsCloseCode(t, ctx, c); code != chat.CloseForbidden {
		t.Errorf("first-frame token for another chat: close %d, want 4403", code)
	}
	// A valid first-frame token: the socket gets the room.
	ff, _, err := websocket.Dial(ctx, wsURL(work.base, 1), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ff.CloseNow()
	if err := ff.Write(ctx, websocket.MessageText, []byte(`{"token":"`+alice+`"}`)); err != nil {
		t.Fatal(err)
	}
	// A token that expires while the socket is open: closed with 4401.
	short, _, err := websocket.Dial(ctx, wsURL(work.base, 1), chattest.WSOpts(mint(t, "alice", both, auth.ChatScope{All: true}, 2*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	w := chattest.WatchURL(t, ctx, work.base+"/ws?chat_id=1")

	// The author travels: alice's send shows her on the peer's socket,
	// in both histories and in the peer's inbox.
	code, raw := do(t, http.MethodPost, msgs, alice, `{"body":"from alice"}`)
	var sent chat.Message
	if code != http.StatusCreated || json.Unmarshal(raw, &sent) != nil || sent.Author != "alice" {
		t.Fatalf("send as alice: %d %s", code, raw)
	}
	got := w.WaitSeqs(t, chat.Consumers, 1, 20*time.Second)
	if got[0].Author != "alice" {
		t.Errorf("frame author %q, want alice", got[0].Author)
	}
	_, data, err := ff.Read(ctx)
	if err != nil || !bytes.Contains(data, []byte(`"author":"alice"`)) {
		t.Errorf("first-frame socket got %s %v, want alice's message", data, err)
	}
	for _, base := range []string{cons.base, work.base} {
		code, raw := do(t, http.MethodGet, base+"/api/chats/1/messages", alice, "")
		if code != http.StatusOK || !bytes.Contains(raw, []byte(`"author":"alice"`)) {
			t.Errorf("history on %s: %d %s, want alice as author", base, code, raw)
		}
	}
	if n := h.Count(t, `SELECT count(*) FROM workers.inbox WHERE author = 'alice'`); n != 1 {
		t.Errorf("workers.inbox rows by alice: %d, want 1", n)
	}
	if code := wsCloseCode(t, ctx, short); code != chat.CloseUnauthorized {
		t.Errorf("expired token on an open socket: close %d, want 4401", code)
	}
}

// TestVerifierCacheKeepsExpiry: a verified token is cached, but stops
// passing when it expires.
func TestVerifierCacheKeepsExpiry(t *testing.T) {
	t.Parallel()
	f := testenv.WriteFile(t, "secret", chattest.Secret)
	v, err := auth.NewVerifier(chat.Workers, auth.Config{SecretFile: f})
	if err != nil {
		t.Fatal(err)
	}
	tok := mint(t, "frank", []string{chat.Workers}, auth.ChatScope{All: true}, 1500*time.Millisecond)
	for range 2 {
		if p, err := v.Verify(tok); err != nil || p.User != "frank" {
			t.Fatalf("fresh token: %v %v", p, err)
		}
	}
	testenv.WaitFor(t, 10*time.Second, "the cached token to expire", func() bool {
		_, err := v.Verify(tok)
		return err != nil
	})
}

// TestJWKSKeys: RS256 and EdDSA tokens are checked against the JWKS file's
// public keys, by kid; HS256 and tokens from other keys are refused.
func TestJWKSKeys(t *testing.T) {
	t.Parallel()
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	otherRSA, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	edPub, edKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	b64 := base64.RawURLEncoding.EncodeToString
	jwks, _ := json.Marshal(map[string]any{"keys": []map[string]string{
		{"kty": "RSA", "kid": "r1", "use": "sig", "n": b64(rsaKey.N.Bytes()), "e": b64(big.NewInt(int64(rsaKey.E)).Bytes())},
		{"kty": "OKP", "crv": "Ed25519", "kid": "e1", "x": b64(edPub)},
	}})
	keysFile := testenv.WriteFile(t, "jwks.json", jwks)
	h := newHarness(t, "")
	cons := h.startAPI(chat.Consumers, func(c *Config) {
		c.API.Auth = auth.Config{KeysFile: keysFile}
	})
	claims := func() jwt.MapClaims {
		return jwt.MapClaims{"sub": "carol", "chats": []int{5}, "svc": chat.Consumers, "exp": time.Now().Add(time.Hour).Unix()}
	}
	sign := func(m jwt.SigningMethod, kid string, key any) string {
		tok := jwt.NewWithClaims(m, claims())
		tok.Header["kid"] = kid
		s, err := tok.SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	u := cons.base + "/api/chats/5/messages"
	for _, tc := range []struct {
		name  string
		token string
		want  int
	}{
		{"RS256", sign(jwt.SigningMethodRS256, "r1", rsaKey), http.StatusOK},
		{"EdDSA", sign(jwt.SigningMethodEdDSA, "e1", edKey), http.StatusOK},
		{"RS256 from another key", sign(jwt.SigningMethodRS256, "r1", otherRSA), http.StatusUnauthorized},
		{"RS256 naming the Ed25519 key", sign(jwt.SigningMethodRS256, "e1", rsaKey), http.StatusUnauthorized},
		{"unknown kid", sign(jwt.SigningMethodEdDSA, "e2", edKey), http.StatusUnauthorized},
		{"HS256 (not configured)", mint(t, "carol", []string{chat.Consumers}, auth.ChatScope{All: true}, time.Hour), http.StatusUnauthorized},
	} {
		if code, raw := do(t, http.MethodGet, u, tc.token, ""); code != tc.want {
			t.Errorf("%s: %d %s, want %d", tc.name, code, raw, tc.want)
		}
	}
}

// TestServeNeedsAuthConfig: without a key Serve refuses to start; with
// Insecure it starts, logs that auth is off, and serves without tokens.
func TestServeNeedsAuthConfig(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	err := Serve(context.Background(), Config{Service: chat.Consumers, DatabaseURL: h.RoleURL(chat.Consumers), API: APIConfig{HTTPAddr: "127.0.0.1:0"},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if !errors.Is(err, auth.ErrNoAuth) {
		t.Fatalf("serve without auth config: %v, want ErrNoAuth", err)
	}
	var logs testenv.SyncBuffer
	cons := h.start(chat.Consumers, func(c *Config) {
		c.API.Auth = auth.Config{Insecure: true}
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	if !strings.Contains(logs.String(), "level=WARN msg=\"AUTHENTICATION IS OFF") {
		t.Errorf("no loud log line:\n%s", logs.String())
	}
	code, raw := do(t, http.MethodPost, cons.base+"/api/chats/1/messages", "", `{"body":"open"}`)
	if code != http.StatusCreated || bytes.Contains(raw, []byte(`"author"`)) {
		t.Fatalf("insecure send: %d %s, want 201 without an author", code, raw)
	}
}

// TestPerUserRateLimit: the per-user limit counts the token's user, not
// the IP: one user over it gets 429 with Retry-After while another user on
// the same IP is served.
func TestPerUserRateLimit(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	cons := h.startAPI(chat.Consumers, func(c *Config) {
		c.API.Guard.UserRate, c.API.Guard.UserBurst = 0.2, 2
	})
	both := []string{chat.Consumers, chat.Workers}
	dave := mint(t, "dave", both, auth.ChatScope{All: true}, time.Hour)
	erin := mint(t, "erin", both, auth.ChatScope{All: true}, time.Hour)
	u := cons.base + "/api/chats/1/messages"
	// The socket's upgrade is a request too: dave's first.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(cons.base, "http")+"/ws?chat_id=1", chattest.WSOpts(dave))
	if err != nil {
		t.Fatalf("dave's socket: %v", err)
	}
	defer c.CloseNow()
	for i := range 1 { // dave's second
		if code, raw := do(t, http.MethodGet, u, dave, ""); code != http.StatusOK {
			t.Fatalf("dave request %d: %d %s", i+2, code, raw)
		}
	}
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	req.Header.Set("Authorization", "Bearer "+dave)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "5" {
		t.Fatalf("dave's third request: %d Retry-After %q, want 429 and 5", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if code, _ := do(t, http.MethodGet, u, erin, ""); code != http.StatusOK {
		t.Fatalf("erin: %d, want 200", code)
	}
	// Sends over the WebSocket count too: an error frame, nothing stored.
	_ = c.Write(ctx, websocket.MessageText, []byte(`{"body":"too fast"}`))
	_, data, err := c.Read(ctx)
	if err != nil || !bytes.Contains(data, []byte("too many messages")) {
		t.Fatalf("dave's socket send: %s %v, want a rate-limit error frame", data, err)
	}
	h.noMessagesStored(t)
}
