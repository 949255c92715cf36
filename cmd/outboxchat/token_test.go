package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/auth"
	"github.com/outboxchat/outboxchat/internal/testenv"
)

// TestTokenCommand mints a token with `outboxchat token` and checks it with
// the services' verifier: user, chats, service and its refusal elsewhere.
func TestTokenCommand(t *testing.T) {
	secret := testenv.WriteFile(t, "secret", []byte(strings.Repeat("k", 32)+"\n"))
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"token", "--jwt-secret-file", secret, "--service", "consumers",
		"--user", "alice", "--chats", "1,2", "--ttl", "1h"}, &out, &errOut)
	if err != nil {
		t.Fatalf("token: %v %s", err, errOut.String())
	}
	v, err := auth.NewVerifier(chat.Consumers, auth.Config{SecretFile: secret})
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
	w, err := auth.NewVerifier(chat.Workers, auth.Config{SecretFile: secret})
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

// TestMigratePrintsRedisACL: `migrate --redis-password-file` prints the
// service's ACL SETUSER line, without the password.
func TestMigratePrintsRedisACL(t *testing.T) {
	pw := testenv.WriteFile(t, "pw", []byte("s3cret\n"))
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"migrate", "--service", "workers", "--redis-password-file", pw}, &out, &errOut); err != nil {
		t.Fatalf("migrate: %v %s", err, errOut.String())
	}
	line := out.String()
	if !strings.HasPrefix(line, "ACL SETUSER workers reset #") || strings.Contains(line, "s3cret") ||
		!strings.Contains(line, `"(~outboxchat:q:{workers-to-consumers}:stream`) || !strings.Contains(line, `"(~outboxchat:q:{consumers-to-workers}:dead +xadd +xtrim +xlen)"`) {
		t.Fatalf("line: %s", line)
	}
}
