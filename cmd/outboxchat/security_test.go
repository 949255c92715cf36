package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxchat/outboxchat/chat"
)

// TestTokenCommand mints a token with `outboxchat token` and checks it with
// the services' verifier: user, chats, service and its refusal elsewhere.
func TestTokenCommand(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte(strings.Repeat("k", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"token", "--jwt-secret-file", secret, "--service", "consumers",
		"--user", "alice", "--chats", "1,2", "--ttl", "1h"}, &out, &errOut)
	if err != nil {
		t.Fatalf("token: %v %s", err, errOut.String())
	}
	v, err := chat.NewVerifier(chat.Consumers, chat.AuthConfig{SecretFile: secret})
	if err != nil {
		t.Fatal(err)
	}
	p, err := v.Verify(strings.TrimSpace(out.String()))
	if err != nil {
		t.Fatalf("verify: %v", err)
	}
	if p.User != "alice" || !p.Chats.Allows(1) || !p.Chats.Allows(2) || p.Chats.Allows(3) {
		t.Fatalf("principal %+v: want alice on chats 1 and 2", p)
	}
	w, err := chat.NewVerifier(chat.Workers, chat.AuthConfig{SecretFile: secret})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Verify(strings.TrimSpace(out.String())); err == nil {
		t.Fatal("a consumers token passed the workers verifier")
	}
	if err := run(context.Background(), []string{"token", "--service", "consumers", "--user", "a", "--chats", "1"}, &out, &errOut); err == nil {
		t.Fatal("token without a secret file: no error")
	}
}
