package server

import (
	"bytes"
	"context"
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

// revoke records a revocation as `outboxchat revoke` does, on service.
func (h *harness) revoke(t *testing.T, service, kind, value string) {
	t.Helper()
	if _, err := h.Admin.Exec(context.Background(), "INSERT INTO "+service+`.revoked_tokens (kind, value) VALUES ($1, $2)
		ON CONFLICT (kind, value) DO UPDATE SET revoked_at = now(), version = excluded.version`, kind, value); err != nil {
		t.Fatal(err)
	}
}

// A revoked user's requests get 401 JSON within seconds and the user's
// open socket is closed with 4401; other users, and the user's tokens
// minted after the revocation, pass; a token revoked by id is refused
// while the same user's other token passes.
func TestRevokedTokens(t *testing.T) {
	t.Parallel()
	h, cons, _ := startBoth(t)
	both := []string{chat.Consumers, chat.Workers}
	alice := mint(t, "alice", both, auth.ChatScope{All: true}, time.Hour)
	bob := mint(t, "bob", both, auth.ChatScope{All: true}, time.Hour)
	msgs := cons.base + "/api/chats/1/messages"
	for _, tok := range []string{alice, bob} {
		if code, raw := do(t, http.MethodGet, msgs, tok, ""); code != http.StatusOK {
			t.Fatalf("before revoking: %d %s", code, raw)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ws := "ws" + strings.TrimPrefix(cons.base, "http") + "/ws?chat_id=1"
	sock, _, err := websocket.Dial(ctx, ws, chattest.WSOpts(alice))
	if err != nil {
		t.Fatal(err)
	}
	defer sock.CloseNow()
	bobSock, _, err := websocket.Dial(ctx, ws, chattest.WSOpts(bob))
	if err != nil {
		t.Fatal(err)
	}
	defer bobSock.CloseNow()

	h.revoke(t, chat.Consumers, auth.RevokeUser, "alice")
	revoked := time.Now()
	closed := make(chan websocket.StatusCode, 1)
	go func() {
		for {
			if _, _, err := sock.Read(ctx); err != nil {
				closed <- websocket.CloseStatus(err)
				return
			}
		}
	}()
	select {
	case code := <-closed:
		if code != chat.CloseUnauthorized {
			t.Fatalf("revoked user's socket closed with %d, want 4401", code)
		}
		t.Logf("socket closed %v after the revocation", time.Since(revoked).Round(time.Millisecond))
	case <-time.After(5 * time.Second):
		t.Fatal("revoked user's socket still open 5 s after the revocation")
	}
	code, raw := do(t, http.MethodGet, msgs, alice, "")
	if code != http.StatusUnauthorized || !bytes.Contains(raw, []byte(`"field":"Authorization"`)) || !bytes.Contains(raw, []byte("revoked")) {
		t.Fatalf("revoked user's GET: %d %s; want 401 JSON naming the revocation", code, raw)
	}
	if code, raw := do(t, http.MethodPost, msgs, alice, `{"body":"x"}`); code != http.StatusUnauthorized {
		t.Fatalf("revoked user's POST: %d %s", code, raw)
	}
	if _, resp, err := websocket.Dial(ctx, ws, chattest.WSOpts(alice)); err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("revoked user's new socket: %v %v; want 401", err, resp)
	}
	if code, _ := do(t, http.MethodGet, msgs, bob, ""); code != http.StatusOK {
		t.Fatalf("another user after the revocation: %d", code)
	}
	// Bob's socket stays open: a frame still reaches it.
	if code, raw := do(t, http.MethodPost, msgs, bob, `{"body":"still here"}`); code != http.StatusCreated {
		t.Fatalf("bob's send: %d %s", code, raw)
	}
	for {
		_, data, err := bobSock.Read(ctx)
		if err != nil {
			t.Fatalf("bob's socket: %v", err)
		}
		if bytes.Contains(data, []byte("still here")) {
			break
		}
	}
	// A token alice gets after the revocation passes (iat has second
	// precision: one minted in the revocation's second is refused).
	testenv.WaitFor(t, 5*time.Second, "a token minted after the revocation to pass", func() bool {
		code, _ := do(t, http.MethodGet, msgs, mint(t, "alice", both, auth.ChatScope{All: true}, time.Hour), "")
		return code == http.StatusOK
	})
	// A token without iat of a revoked user is refused.
	noIat, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"sub": "alice", "chats": "*", "svc": both, "exp": time.Now().Add(time.Hour).Unix(),
	}).SignedString(chattest.Secret)
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := do(t, http.MethodGet, msgs, noIat, ""); code != http.StatusUnauthorized {
		t.Fatalf("revoked user's token without iat: %d, want 401", code)
	}

	// By token id: carol's first token is refused, her second passes.
	carol1 := mint(t, "carol", both, auth.ChatScope{All: true}, time.Hour)
	carol2 := mint(t, "carol", both, auth.ChatScope{All: true}, time.Hour)
	var claims auth.TokenClaims
	if _, _, err := jwt.NewParser().ParseUnverified(carol1, &claims); err != nil || claims.ID == "" {
		t.Fatalf("minted token has no jti: %v", err)
	}
	h.revoke(t, chat.Consumers, auth.RevokeToken, claims.ID)
	testenv.WaitFor(t, 5*time.Second, "the revoked token id to be refused", func() bool {
		code, _ := do(t, http.MethodGet, msgs, carol1, "")
		return code == http.StatusUnauthorized
	})
	if code, _ := do(t, http.MethodGet, msgs, carol2, ""); code != http.StatusOK {
		t.Fatalf("carol's other token: %d, want 200", code)
	}
	if v := scrape(t, cons.base, "outboxchat_auth_revoked"); v != 2 {
		t.Fatalf("outboxchat_auth_revoked = %v, want 2", v)
	}
}
