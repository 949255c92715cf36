// Command outboxchat runs the chat services, applies their schema, and runs
// the lab that proves and measures the outbox's guarantees.
//
//	outboxchat serve   --service consumers|workers [--role api,relay,worker] [--database-url URL] [--listen-database-url URL] [--redis-url URL] [--http ADDR]
//	outboxchat migrate --service consumers|workers [--database-url URL] [--redis-password-file F [--redis-admin-url URL]]
//	outboxchat token   --jwt-secret-file F --service S[,S] --user U --chats 1,2|* [--ttl 1h]
//	outboxchat lab up|chaos|latency|bench|demo [flags]
//	outboxchat status [--database-url URL] [--redis-url URL] [--json]
//	outboxchat deadletters list|show|replay|drop [--service S] [--redis-url URL] [--json] [ID ...]
//	outboxchat outbox parked|retry --service S [--database-url URL] [--json]
//
// See the README and DESIGN.md for the contracts.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/internal/labfault"
	"github.com/outboxchat/outboxchat/lab"
	"github.com/outboxchat/outboxchat/outbox"
	"github.com/outboxchat/outboxchat/redisq"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		return // -h: the usage was printed; asking for it is not a failure
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "outboxchat:", err)
		os.Exit(1)
	}
}

const usage = `usage: outboxchat <command> [flags]

commands:
  serve    run a service (consumers or workers)
  migrate  create the service's role and schema, apply migrations
  token    mint a development JWT (HS256) for a user, services and chats
  lab      up | chaos | latency | bench | demo: private servers, fault experiments, measurements
  status       both services on one screen; exits 1 when something needs a person
  deadletters  list | show | replay | drop the dead letters
  outbox       parked | retry: the outbox rows parked after failed publishes
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("no command")
	}
	switch args[0] {
	case "serve":
		return serve(ctx, args[1:], stderr)
	case "migrate":
		return migrate(ctx, args[1:], stdout, stderr)
	case "token":
		return token(args[1:], stdout, stderr)
	case "lab":
		return lab.Run(ctx, args[1:], stdout, stderr)
	case "status":
		return status(ctx, args[1:], stdout, stderr)
	case "deadletters":
		return deadletters(ctx, args[1:], stdout, stderr)
	case "outbox":
		return outboxCmd(ctx, args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", args[0])
}

func newLogger(w io.Writer, format string) *slog.Logger {
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, nil))
	}
	return slog.New(slog.NewTextHandler(w, nil))
}

func serve(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	service := fs.String("service", "", "consumers or workers (required)")
	roles := fs.String("role", "", "roles to run: any of api,relay,worker (default all)")
	dbURL := fs.String("database-url", os.Getenv("DATABASE_URL"), fmt.Sprintf("Postgres URL of the service's role (default $DATABASE_URL); pgxpool parameters in it are honoured: pool_max_conns=N sets the pool size (default %d: group committer 1 + slow lanes up to 4 + history and gateway reads for the api role, 1 per relay pass, 1 per inbox batch; LISTEN connections are extra)", chat.DefaultPoolMaxConns))
	listenURL := fs.String("listen-database-url", os.Getenv("LISTEN_DATABASE_URL"), "Postgres URL of the process's one LISTEN connection (relay and gateway wake-ups), direct or through a session-mode pooler, for when --database-url goes through a transaction-mode pooler such as PgBouncer (default $LISTEN_DATABASE_URL, else --database-url)")
	redisURL := fs.String("redis-url", os.Getenv("REDIS_URL"), "Redis URL (default $REDIS_URL)")
	sendLock := fs.Duration("send-lock-timeout", chat.DefaultSendLockTimeout, "how long a send waits for its chat's lock (held by another session) before it answers 503, storing nothing")
	readTimeout := fs.Duration("read-timeout", chat.DefaultReadTimeout, "bound on each history read (then 503)")
	httpAddr := fs.String("http", "", "HTTP listen address (default 127.0.0.1:8080 consumers, 127.0.0.1:8081 workers)")
	mode := fs.String("mode", chat.ModeOutbox, "send path: v2 (transactional outbox) or v1 (naive dual write, lab only)")
	wake := fs.String("wake", "after-commit", "relay wake-up: after-commit (fast), in-tx (NOTIFY in the send transaction) or none (poll only); after_commit and in_tx are accepted too")
	pollOnly := fs.Bool("poll-only", false, "relay: no LISTEN, poll every --poll-interval")
	poll := fs.Duration("poll-interval", outbox.DefaultPollInterval, "relay poll fallback interval")
	lock := fs.Duration("lock-duration", redisq.DefaultLockDuration, "how long a job may stay unacknowledged before it is handed out again")
	redrive := fs.Duration("redrive-after", -1, "publish a sent message again when no receipt came back within this long (default 2 × --lock-duration; 0 = off)")
	gap := fs.Duration("gap-timeout", 0, "how long the WebSocket gateway holds received messages behind a missing seq (0 = 2 × --lock-duration; negative = no hold)")
	consumer := fs.String("consumer-name", "", "this worker's name in the consumer group, stable across restarts (default <service>-<hostname>)")
	maxBody := fs.Int("max-body-bytes", chat.DefaultMaxBodyBytes, "message body limit in bytes")
	prefix := fs.String("redis-prefix", chat.DefaultRedisPrefix, "prefix of every Redis key")
	fault := fs.String("fault", os.Getenv("OUTBOXCHAT_FAULT"), "fault injection for the lab, KIND:SEQ (default $OUTBOXCHAT_FAULT; off)")
	maxAttempts := fs.Int("relay-max-attempts", outbox.DefaultMaxAttempts, "relay: park an outbox row after this many failed publishes of its own (broker outages never count; negative = never park)")
	deadMax := fs.Int64("dead-letter-max", redisq.DefaultDeadLetterMax, "worker: keep at most this many dead letters (the oldest are dropped, counted in outboxchat_deadletter_trimmed_total; negative = no cap)")
	vacuumRows := fs.Int64("outbox-vacuum-rows", outbox.DefaultVacuumDeadRows, "relay: VACUUM the outbox once it holds this many dead (published and deleted) rows, checked every 2 s (negative = leave it to autovacuum)")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	shutdownDelay := fs.Duration("shutdown-delay", 0, "on SIGTERM, keep serving this long with /readyz answering 503 before the listener closes (for a load balancer's probe)")
	debugAddr := fs.String("debug-addr", "", "serve Go's pprof profiles (/debug/pprof/) on this address, e.g. 127.0.0.1:6060 (default off)")
	guard := guardFlags(fs)
	auth := authFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	r, err := chat.ParseRoles(*roles)
	if err != nil {
		return err
	}
	wm, err := outbox.ParseWakeMode(*wake)
	if err != nil {
		return fmt.Errorf("--wake %q: want after-commit, in-tx or none", *wake)
	}
	if *debugAddr != "" {
		ln, err := net.Listen("tcp", *debugAddr)
		if err != nil {
			return fmt.Errorf("--debug-addr: %w", err)
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
	}
	log := newLogger(stderr, *logFormat)
	var hooks chat.Hooks // nil unless --fault: an interface holding a nil *Fault is not nil
	if f, err := labfault.Parse(*fault, log.With("service", *service)); err != nil {
		return err
	} else if f != nil {
		hooks = f
	}
	return chat.Serve(ctx, chat.Config{
		Service: *service, Roles: r, DatabaseURL: *dbURL, ListenDatabaseURL: *listenURL, RedisURL: *redisURL, HTTPAddr: *httpAddr,
		Mode: *mode, Wake: wm, PollOnly: *pollOnly, PollInterval: *poll, LockDuration: *lock,
		RedriveAfter: redriveAfter(*redrive),
		GapTimeout:   *gap, ConsumerName: *consumer, MaxBodyBytes: *maxBody, RedisPrefix: *prefix, Hooks: hooks,
		SendLockTimeout: *sendLock, ReadTimeout: *readTimeout, ShutdownDelay: *shutdownDelay,
		RelayMaxAttempts: *maxAttempts, DeadLetterMax: *deadMax, OutboxVacuumRows: *vacuumRows,
		Guard: guard.config(), Auth: auth.config(), EventKeyFile: *auth.eventKeys,
		TLSCertFile: *auth.tlsCert, TLSKeyFile: *auth.tlsKey, Logger: log,
	})
}

func migrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	service := fs.String("service", "", "consumers or workers (required)")
	dbURL := fs.String("database-url", os.Getenv("DATABASE_URL"), "Postgres URL; a superuser URL also creates the role and schema (default $DATABASE_URL)")
	acl := redisACLFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if acl.wanted() {
		if err := acl.run(ctx, *service, stdout); err != nil {
			return err
		}
		if *dbURL == "" {
			return nil // the Redis user only
		}
	}
	if *dbURL == "" {
		return errors.New("migrate: no database URL (--database-url or DATABASE_URL)")
	}
	pool, err := pgxpool.New(ctx, *dbURL)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer pool.Close()
	if err := chat.CheckPooler(ctx, pool, nil); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	var canCreate bool
	if err := pool.QueryRow(ctx, `SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user`).Scan(&canCreate); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if canCreate {
		if err := chat.Bootstrap(ctx, pool, *service); err != nil {
			return err
		}
	}
	n, err := chat.Migrate(ctx, pool, *service)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: %d migration(s) applied\n", *service, n)
	return nil
}

// redriveAfter maps --redrive-after to chat.Config.RedriveAfter: the flag's
// -1 (unset) is the default (0), 0 is off (negative).
func redriveAfter(flagValue time.Duration) time.Duration {
	switch {
	case flagValue < 0:
		return 0
	case flagValue == 0:
		return -1
	}
	return flagValue
}
