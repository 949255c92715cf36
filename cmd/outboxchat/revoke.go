package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/auth"
	"github.com/outboxchat/outboxchat/cmd/outboxchat/internal/cliflag"
)

// revokeSQL records one revocation; revoking the same user or token again
// moves revoked_at and version on, so the API processes (which read rows
// by version) see it again and a user's tokens issued since are refused
// too.
const revokeSQL = `INSERT INTO %s (kind, value, reason) VALUES ($1, $2, $3)
ON CONFLICT (kind, value) DO UPDATE SET revoked_at = now(), reason = excluded.reason, version = excluded.version
RETURNING revoked_at`

// runRevoke runs `outboxchat revoke`: it records in each service's
// revoked_tokens table that a user's tokens issued until now (--user), or
// one token (--token-id, its jti), are refused. Every API process reads
// the table every second: from then on requests with such a token get
// 401, and its open WebSockets are closed with 4401.
func runRevoke(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("revoke", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := newOpsFlags(fs, true, false)
	user := fs.String("user", "", "revoke every token of this user (sub) issued until now")
	tokenID := fs.String("token-id", "", "revoke the token with this id (jti)")
	services := fs.String("service", chat.Consumers+","+chat.Workers, "the services whose API refuses it")
	reason := fs.String("reason", "", "why (stored with the revocation)")
	if err := cliflag.Parse(fs, args); err != nil {
		return err
	}
	if (*user == "") == (*tokenID == "") {
		return cliflag.Usagef(fs, "revoke: give exactly one of --user and --token-id")
	}
	kind, value := auth.RevokeUser, *user
	if *tokenID != "" {
		kind, value = auth.RevokeToken, *tokenID
	}
	svcs := cliflag.List(*services)
	for _, s := range svcs {
		if err := chat.CheckService(s); err != nil {
			return cliflag.Usagef(fs, "revoke: --service: %w", err)
		}
	}
	pool, err := f.pool(ctx, "revoke")
	if err != nil {
		return err
	}
	defer pool.Close()
	var at time.Time
	for _, s := range svcs {
		if err := pool.QueryRow(ctx, fmt.Sprintf(revokeSQL, pgx.Identifier{s, "revoked_tokens"}.Sanitize()), kind, value, *reason).Scan(&at); err != nil {
			return fmt.Errorf("revoke: %s: %w", s, err)
		}
	}
	if *f.asJSON {
		return printJSON(stdout, map[string]any{"kind": kind, "value": value, "services": svcs, "revoked_at": at.UTC().Format(time.RFC3339Nano)})
	}
	fmt.Fprintf(stdout, "revoked %s %s on %v at %s: refused by every API process within about a second; its open WebSockets are closed with 4401\n",
		kind, value, svcs, at.UTC().Format(time.RFC3339))
	return nil
}
