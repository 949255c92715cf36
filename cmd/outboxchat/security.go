package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/redisq"
)

// guardFlagSet holds serve's connection-guard flags (chat.GuardConfig).
type guardFlagSet struct {
	hosts, origins                     *string
	readHeader, bodyRead, idle         *time.Duration
	ping, pong                         *time.Duration
	userRate, ipRate                   *float64
	userBurst, ipBurst, socketsPerUser *int
}

func guardFlags(fs *flag.FlagSet) *guardFlagSet {
	g := &guardFlagSet{
		hosts:          fs.String("allowed-hosts", "", "comma-separated host names the Host header may name, or * (default: the listen host, localhost, 127.0.0.1, ::1; any IP literal when listening on 0.0.0.0)"),
		origins:        fs.String("allowed-origins", "", "comma-separated origins (scheme://host[:port]) pages may call the API and open WebSockets from, or * (default: same origin on an allowed host)"),
		readHeader:     fs.Duration("read-header-timeout", chat.DefaultReadHeaderTimeout, "bound on reading a request's headers"),
		bodyRead:       fs.Duration("body-read-timeout", chat.DefaultBodyReadTimeout, "bound on reading a request's body (then 408, connection closed)"),
		idle:           fs.Duration("idle-timeout", chat.DefaultIdleTimeout, "close keep-alive connections idle this long"),
		ping:           fs.Duration("ws-ping-interval", chat.DefaultPingInterval, "WebSocket ping interval"),
		pong:           fs.Duration("ws-pong-timeout", chat.DefaultPongTimeout, "drop a WebSocket whose pong takes longer than this"),
		userRate:       fs.Float64("rate-user", chat.DefaultUserRate, "requests and WebSocket sends per second per user (negative: no limit)"),
		userBurst:      fs.Int("burst-user", chat.DefaultUserBurst, "requests at once per user"),
		ipRate:         fs.Float64("rate-ip", chat.DefaultIPRate, "API and WebSocket requests per second per client IP (negative: no limit)"),
		ipBurst:        fs.Int("burst-ip", chat.DefaultIPBurst, "requests at once per client IP"),
		socketsPerUser: fs.Int("ws-per-user", chat.DefaultSocketsPerUser, "open WebSockets per user (negative: no cap)"),
	}
	return g
}

func (g *guardFlagSet) config() chat.GuardConfig {
	return chat.GuardConfig{
		AllowedHosts: splitList(*g.hosts), AllowedOrigins: splitList(*g.origins),
		ReadHeaderTimeout: *g.readHeader, BodyReadTimeout: *g.bodyRead, IdleTimeout: *g.idle,
		PingInterval: *g.ping, PongTimeout: *g.pong,
		UserRate: *g.userRate, UserBurst: *g.userBurst, IPRate: *g.ipRate, IPBurst: *g.ipBurst,
		SocketsPerUser: *g.socketsPerUser,
	}
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// authFlagSet holds serve's authentication flags (chat.AuthConfig).
type authFlagSet struct {
	secretFile, keysFile, eventKeys *string
	tlsCert, tlsKey                 *string
	insecure                        *bool
}

func authFlags(fs *flag.FlagSet) *authFlagSet {
	return &authFlagSet{
		secretFile: fs.String("jwt-secret-file", os.Getenv("OUTBOXCHAT_JWT_SECRET_FILE"), "file holding the HS256 secret of bearer tokens, ≥ 32 bytes (default $OUTBOXCHAT_JWT_SECRET_FILE)"),
		keysFile:   fs.String("jwt-keys-file", "", "JWKS file of RS256/EdDSA public keys of bearer tokens"),
		insecure:   fs.Bool("insecure-no-auth", false, "serve the API without authentication (anyone reaching it reads and writes every chat)"),
		tlsCert:    fs.String("tls-cert", "", "PEM certificate (chain) file: serve HTTPS and WSS (with --tls-key)"),
		tlsKey:     fs.String("tls-key", "", "PEM private key file of --tls-cert"),
		eventKeys:  fs.String("event-key-file", os.Getenv("OUTBOXCHAT_EVENT_KEY_FILE"), "HMAC keys signing and checking stream entries, lines \"<consumers-to-workers|workers-to-consumers> <hex key>\" (default $OUTBOXCHAT_EVENT_KEY_FILE; none: entries unsigned)"),
	}
}

func (a *authFlagSet) config() chat.AuthConfig {
	return chat.AuthConfig{SecretFile: *a.secretFile, KeysFile: *a.keysFile, Insecure: *a.insecure}
}

// token runs `outboxchat token`: prints an HS256 token signed with the
// secret file's key.
func token(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("token", flag.ContinueOnError)
	fs.SetOutput(stderr)
	secretFile := fs.String("jwt-secret-file", os.Getenv("OUTBOXCHAT_JWT_SECRET_FILE"), "file holding the HS256 secret (default $OUTBOXCHAT_JWT_SECRET_FILE)")
	services := fs.String("service", "", "service(s) the token is for: consumers, workers or consumers,workers (required)")
	user := fs.String("user", "", "the user, the token's sub (required)")
	chats := fs.String("chats", "", "chat ids the user may use, comma-separated, or * for all (required)")
	ttl := fs.Duration("ttl", time.Hour, "how long the token is valid")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *secretFile == "" || *services == "" || *user == "" || *chats == "" {
		fs.Usage()
		return errors.New("token: --jwt-secret-file, --service, --user and --chats are required")
	}
	secret, err := chat.ReadSecretFile(*secretFile)
	if err != nil {
		return fmt.Errorf("token: %w", err)
	}
	scope, err := chat.ParseChatScope(*chats)
	if err != nil {
		return fmt.Errorf("token: %w", err)
	}
	t, err := chat.MintToken(secret, *user, splitList(*services), scope, *ttl)
	if err != nil {
		return fmt.Errorf("token: %w", err)
	}
	fmt.Fprintln(stdout, t)
	return nil
}

// redisACLFlagSet holds migrate's Redis ACL flags.
type redisACLFlagSet struct {
	passwordFile, adminURL, user, prefix *string
}

func redisACLFlags(fs *flag.FlagSet) *redisACLFlagSet {
	return &redisACLFlagSet{
		passwordFile: fs.String("redis-password-file", "", "make the service's least-privilege Redis user with this file's password: print its ACL SETUSER line, or apply it with --redis-admin-url"),
		adminURL:     fs.String("redis-admin-url", "", "Redis URL of an administrator: apply the ACL SETUSER line (and ACL SAVE) instead of printing it"),
		user:         fs.String("redis-user", "", "the service's Redis user name (default the service name)"),
		prefix:       fs.String("redis-prefix", chat.DefaultRedisPrefix, "the services' --redis-prefix (the user's keys)"),
	}
}

func (a *redisACLFlagSet) wanted() bool { return *a.passwordFile != "" }

// run prints or applies service's ACL SETUSER line.
func (a *redisACLFlagSet) run(ctx context.Context, service string, stdout io.Writer) error {
	b, err := os.ReadFile(*a.passwordFile)
	if err != nil {
		return fmt.Errorf("migrate: redis password: %w", err)
	}
	user := *a.user
	if user == "" {
		user = service
	}
	args, err := chat.RedisACL(service, *a.prefix, user, strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if *a.adminURL == "" {
		fmt.Fprintln(stdout, chat.RedisACLLine(args))
		return nil
	}
	rdb, err := redisq.NewClient(*a.adminURL)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer rdb.Close()
	if err := chat.ApplyRedisACL(ctx, rdb, args); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	fmt.Fprintf(stdout, "%s: redis user %s set\n", service, user)
	return nil
}
