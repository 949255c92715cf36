package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/outboxchat/outboxchat/chat/auth"
	"github.com/outboxchat/outboxchat/cmd/outboxchat/internal/cliflag"
)

// runToken runs `outboxchat token`: prints an HS256 token signed with the
// secret file's key.
func runToken(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("token", flag.ContinueOnError)
	fs.SetOutput(stderr)
	secretFile := cliflag.EnvString(fs, "jwt-secret-file", "OUTBOXCHAT_JWT_SECRET_FILE", "file holding the HS256 secret (default $OUTBOXCHAT_JWT_SECRET_FILE)")
	services := fs.String("service", "", "service(s) the token is for: consumers, workers or consumers,workers (required)")
	user := fs.String("user", "", "the user, the token's sub (required)")
	chats := fs.String("chats", "", "chat ids the user may use, comma-separated, or * for all (required)")
	ttl := fs.Duration("ttl", time.Hour, "how long the token is valid")
	if err := cliflag.Parse(fs, args); err != nil {
		return err
	}
	if *secretFile == "" || *services == "" || *user == "" || *chats == "" {
		fs.Usage()
		return errors.New("token: --jwt-secret-file, --service, --user and --chats are required")
	}
	secret, err := auth.ReadSecretFile(*secretFile)
	if err != nil {
		return fmt.Errorf("token: %w", err)
	}
	scope, err := auth.ParseChatScope(*chats)
	if err != nil {
		return fmt.Errorf("token: %w", err)
	}
	t, err := auth.MintToken(secret, *user, cliflag.List(*services), scope, *ttl)
	if err != nil {
		return fmt.Errorf("token: %w", err)
	}
	fmt.Fprintln(stdout, t)
	return nil
}
