package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/outboxchat/outboxchat/chat"
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
	var missing []string
	for _, r := range []struct {
		name, value string
	}{{"--jwt-secret-file", *secretFile}, {"--service", *services}, {"--user", *user}, {"--chats", *chats}} {
		if r.value == "" {
			missing = append(missing, r.name)
		}
	}
	switch {
	case len(missing) == 1:
		return cliflag.Usagef(fs, "token: %s is required", missing[0])
	case len(missing) > 1:
		return cliflag.Usagef(fs, "token: %s are required", andList(missing))
	}
	for _, s := range cliflag.List(*services) {
		if err := chat.CheckService(s); err != nil {
			return cliflag.Usagef(fs, "token: --service: %w", err)
		}
	}
	scope, err := auth.ParseChatScope(*chats)
	if err != nil {
		return cliflag.Usagef(fs, "token: %w", err)
	}
	if *ttl <= 0 {
		return cliflag.Usagef(fs, "token: --ttl %v: want a duration above 0, e.g. 1h", *ttl)
	}
	secret, err := auth.ReadSecretFile(*secretFile)
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

// andList joins words as "a, b and c".
func andList(words []string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " and " + words[len(words)-1]
}
