package main

import (
	"context"
	"strings"
	"testing"

	"github.com/outboxchat/outboxchat/chat"
)

// revoke writes one row per service; revoking again moves its version on
// (the API processes read rows by version); bad flags write nothing.
func TestRevokeCommand(t *testing.T) {
	ctx := context.Background()
	dbURL, admin := migratedDatabase(t)
	db := []string{"--database-url", dbURL}
	for _, bad := range [][]string{{}, {"--user", "a", "--token-id", "b"}, {"--user", "a", "--service", "nobody"}} {
		if _, err := runCmd(t, append(append([]string{"revoke"}, bad...), db...)...); err == nil {
			t.Errorf("revoke %v succeeded", bad)
		}
	}
	version := func(svc string) int64 {
		var v int64
		if err := admin.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM "+svc+".revoked_tokens WHERE kind = 'user' AND value = 'alice'").Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v := version(chat.Consumers) + version(chat.Workers); v != 0 {
		t.Fatalf("rows after refused revokes (version sum %d)", v)
	}
	out, err := runCmd(t, append([]string{"revoke", "--user", "alice", "--reason", "left"}, db...)...)
	if err != nil || !strings.Contains(out, "revoked user alice") {
		t.Fatalf("revoke = %v: %s", err, out)
	}
	v1c, v1w := version(chat.Consumers), version(chat.Workers)
	if v1c == 0 || v1w == 0 {
		t.Fatalf("versions after revoke: %d, %d", v1c, v1w)
	}
	out, err = runCmd(t, append([]string{"revoke", "--user", "alice", "--service", chat.Workers, "--json"}, db...)...)
	if err != nil || !strings.Contains(out, `"kind": "user"`) || !strings.Contains(out, `"revoked_at"`) {
		t.Fatalf("revoke again = %v: %s", err, out)
	}
	if version(chat.Workers) <= v1w || version(chat.Consumers) != v1c {
		t.Fatalf("revoking again on workers: versions %d→%d (workers), %d→%d (consumers)", v1w, version(chat.Workers), v1c, version(chat.Consumers))
	}
	if _, err := runCmd(t, append([]string{"revoke", "--token-id", "abc"}, db...)...); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM consumers.revoked_tokens WHERE kind = 'token' AND value = 'abc'").Scan(&n); err != nil || n != 1 {
		t.Fatalf("token revocation rows %d, %v", n, err)
	}
}
