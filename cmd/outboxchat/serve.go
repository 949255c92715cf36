package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/auth"
	"github.com/outboxchat/outboxchat/chat/httpapi"
	"github.com/outboxchat/outboxchat/chat/lease"
	"github.com/outboxchat/outboxchat/chat/schema"
	"github.com/outboxchat/outboxchat/chat/server"
	"github.com/outboxchat/outboxchat/chat/store"
	"github.com/outboxchat/outboxchat/chat/telemetry"
	"github.com/outboxchat/outboxchat/cmd/outboxchat/internal/cliflag"
	"github.com/outboxchat/outboxchat/lab/fault"
	"github.com/outboxchat/outboxchat/outbox"
	"github.com/outboxchat/outboxchat/redisq"
)

// runServe runs `outboxchat serve`: one service's roles until ctx ends.
func runServe(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	service := fs.String("service", "", "consumers or workers (required)")
	roles := fs.String("role", "", "roles to run: any of api,relay,worker (default all)")
	dbURL := cliflag.EnvString(fs, "database-url", "DATABASE_URL", fmt.Sprintf("Postgres URL of the service's role (default $DATABASE_URL); pgxpool parameters in it are honoured: pool_max_conns=N sets the pool size (%d when absent: group committer 1 + slow lanes up to 4 + history and gateway reads for the api role, 1 per relay pass, 1 per inbox batch; LISTEN connections are extra)", schema.DefaultPoolMaxConns))
	listenURL := cliflag.EnvString(fs, "listen-database-url", "LISTEN_DATABASE_URL", "Postgres URL of the process's one LISTEN connection (relay and gateway wake-ups), direct or through a session-mode pooler, for when --database-url goes through a transaction-mode pooler such as PgBouncer (default $LISTEN_DATABASE_URL, else --database-url)")
	redisURL := cliflag.EnvString(fs, "redis-url", "REDIS_URL", "Redis URL (default $REDIS_URL)")
	brokerURL := cliflag.EnvString(fs, "broker-url", "BROKER_URL", "the queue between the services on NATS JetStream: nats://host:4222 (a comma-separated list for a cluster); Redis (--redis-url) stays for the seq fence, presence, typing and token revocation (default $BROKER_URL, else \"\": Redis Streams on --redis-url)")
	brokerReplicas := fs.Int("broker-replicas", 1, "with --broker-url: replicas of each JetStream stream (3 on a three-node cluster)")
	sendLock := fs.Duration("send-lock-timeout", store.DefaultSendLockTimeout, "how long a send waits for its chat's lock (held by another session) before it answers 503, storing nothing")
	readTimeout := fs.Duration("read-timeout", store.DefaultReadTimeout, "bound on each history read (then 503)")
	httpAddr := fs.String("http", "", "HTTP listen address (default 127.0.0.1:8080 consumers, 127.0.0.1:8081 workers)")
	mode := fs.String("mode", server.ModeOutbox, "send path: v2 (transactional outbox) or v1 (naive dual write, lab only)")
	wake := fs.String("wake", "after-commit", "relay wake-up: after-commit (fast), in-tx (NOTIFY in the send transaction) or none (poll only); after_commit and in_tx are accepted too")
	pollOnly := fs.Bool("poll-only", false, "relay: no LISTEN, poll every --poll-interval")
	poll := fs.Duration("poll-interval", outbox.DefaultPollInterval, "relay poll fallback interval")
	linger := fs.Duration("relay-linger", server.DefaultRelayLinger, "relay: under load (the previous pass published more than one row), a woken pass begins no sooner than this after the previous one began, so it carries the rows committed meanwhile; an idle relay never waits (0 = off)")
	partitions := cliflag.EnvInt(fs, "partitions", "OUTBOXCHAT_PARTITIONS", chat.DefaultPartitions, "partitions per direction, the same on both services: each has its own outbox table, relay, stream and consumer; a chat's events all take partition chat_id mod N (default $OUTBOXCHAT_PARTITIONS, else 1: one lane, the layout without partitions); change it only on a drained deployment (docs/DEPLOYING.md)")
	leaseTTL := fs.Duration("lease-ttl", lease.DefaultTTL, "with --partitions above 1: how long a relay process's partition lease lasts unless renewed (renewed every third of it; a killed process's partitions are taken over within about 4/3 of it)")
	lock := fs.Duration("lock-duration", redisq.DefaultLockDuration, "how long a job may stay unacknowledged before it is handed out again")
	redrive := fs.Duration("redrive-after", -1, "publish a sent message again when no receipt came back within this long (default 2 × --lock-duration; 0 = off)")
	cliflag.HideDefault(fs, "redrive-after") // -1 stands for "unset": the usage says the default
	gap := fs.Duration("gap-timeout", 0, "how long the WebSocket gateway holds received messages behind a missing seq (0 = 2 × --lock-duration; negative = no hold)")
	consumer := fs.String("consumer-name", "", "this worker's name in the consumer group; two live processes must not share one (default: a unique <service>-<hostname>-<n>, claimed at start)")
	maxBody := fs.Int("max-body-bytes", chat.DefaultMaxBodyBytes, "message body limit in bytes")
	prefix := fs.String("redis-prefix", chat.DefaultRedisPrefix, "prefix of every Redis key")
	replicaAcks := fs.Int("redis-replica-acks", 0, "relay (and api with --mode v1): mark outbox rows sent only once this many replicas of the queue's Redis master have their entries (WAIT after each add of up to 500 jobs, at most 500ms; rows wait in the outbox while fewer replicas are in sync), so that a Redis failover cannot lose them: set it to the replicas each master has (Sentinel, Cluster); needs the ACL of migrate --redis-admin-url from this version (default 0: the master's answer alone)")
	faultSpec := cliflag.EnvString(fs, "fault", "OUTBOXCHAT_FAULT", "fault injection for the lab, KIND:SEQ (default $OUTBOXCHAT_FAULT; off)")
	maxAttempts := fs.Int("relay-max-attempts", outbox.DefaultMaxAttempts, "relay: park an outbox row after this many failed publishes of its own (broker outages never count; negative = never park)")
	deadMax := fs.Int64("dead-letter-max", redisq.DefaultDeadLetterMax, "worker: keep at most this many dead letters (the oldest are dropped, counted in outboxchat_deadletter_trimmed_total; negative = no cap)")
	retention := fs.Duration("history-retention", 0, "relay: delete history (messages, inbox, receipts, gap fills, duplicates) older than this, every minute, keeping what seq and receipts need (0 = keep everything)")
	vacuumRows := fs.Int64("outbox-vacuum-rows", outbox.DefaultVacuumDeadRows, "relay: VACUUM the outbox once it holds this many dead (published and deleted) rows, checked every 2 s (negative = leave it to autovacuum)")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	shutdownDelay := fs.Duration("shutdown-delay", 0, "on SIGTERM, keep serving this long with /readyz answering 503 before the listener closes (for a load balancer's probe)")
	debugAddr := fs.String("debug-addr", "", "serve Go's pprof profiles (/debug/pprof/) on this address, e.g. 127.0.0.1:6060 (default off)")
	guard := guardFlags(fs)
	auth := authFlags(fs)
	if err := cliflag.Parse(fs, args); err != nil {
		return err
	}
	if err := checkServiceFlag(fs, "serve", *service); err != nil {
		return err
	}
	if *httpAddr != "" {
		// Checked before anything connects: a bare port, as lab up's
		// --consumers-addr takes, is a mistake here.
		if _, _, err := net.SplitHostPort(*httpAddr); err != nil {
			return cliflag.Usagef(fs, "serve: --http %q: want host:port, such as 127.0.0.1:8080", *httpAddr)
		}
	}
	r, err := server.ParseRoles(*roles)
	if err != nil {
		return err
	}
	if *linger < 0 {
		return fmt.Errorf("--relay-linger %v: want 0 (off) or more", *linger)
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
	guardCfg, err := guard.config()
	if err != nil {
		return err
	}
	log := newLogger(stderr, *logFormat)
	redis.SetLogger(redisLogger{log: log.With("component", "redis"), level: slog.LevelWarn})
	var hooks server.Hooks // nil unless --fault: an interface holding a nil *Crash is not nil
	if f, err := fault.ParseCrash(*faultSpec, log.With("service", *service)); err != nil {
		return err
	} else if f != nil {
		hooks = f
	}
	// Tracing from the standard OTEL_* variables; off (nil) when none is
	// set. Flushed after the server has stopped.
	tp, shutdownTracing, err := telemetry.FromEnv(ctx, *service)
	if err != nil {
		return err
	}
	var tracer trace.TracerProvider // nil unless configured: an interface holding a nil pointer is not nil
	if tp != nil {
		tracer = tp
		log.Info("tracing on: spans exported over OTLP/HTTP (OTEL_* environment)")
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), telemetry.ShutdownTimeout)
		defer cancel()
		if err := shutdownTracing(sctx); err != nil {
			log.Warn("flushing traces failed", "err", err)
		}
	}()
	return server.Serve(ctx, server.Config{
		Service: *service, Roles: r, Mode: *mode, DatabaseURL: *dbURL, ListenDatabaseURL: *listenURL,
		RedisURL: *redisURL, BrokerURL: *brokerURL, BrokerReplicas: *brokerReplicas, RedisPrefix: *prefix, RedisReplicaAcks: *replicaAcks, LockDuration: *lock, Partitions: *partitions, EventKeyFile: *auth.eventKeys,
		Hooks: hooks, Logger: log, TracerProvider: tracer,
		API: server.APIConfig{
			HTTPAddr: *httpAddr, Wake: wm, MaxBodyBytes: *maxBody, SendLockTimeout: *sendLock, ReadTimeout: *readTimeout,
			GapTimeout: *gap, Auth: auth.config(), TLSCertFile: *auth.tlsCert, TLSKeyFile: *auth.tlsKey,
			Guard: guardCfg, ShutdownDelay: *shutdownDelay,
		},
		Relay: server.RelayConfig{
			PollOnly: *pollOnly, PollInterval: *poll, Linger: relayLinger(*linger), RedriveAfter: redriveAfter(*redrive),
			MaxAttempts: *maxAttempts, OutboxVacuumRows: *vacuumRows, HistoryRetention: *retention,
			LeaseTTL: *leaseTTL,
		},
		Worker: server.WorkerConfig{ConsumerName: *consumer, DeadLetterMax: *deadMax},
	})
}

// redriveAfter maps --redrive-after, whose 0 means off (as an operator
// reads it), to server.RelayConfig.RedriveAfter, whose zero value is the
// default: the flag's -1 (unset) becomes 0, its 0 becomes -1 (off).
func redriveAfter(flagValue time.Duration) time.Duration {
	switch {
	case flagValue < 0:
		return 0
	case flagValue == 0:
		return -1
	}
	return flagValue
}

// guardFlagSet holds serve's connection-guard flags (httpapi.GuardConfig).
type guardFlagSet struct {
	hosts, origins                     *string
	readHeader, bodyRead, idle         *time.Duration
	ping, pong                         *time.Duration
	userRate, ipRate                   *float64
	userBurst, ipBurst, socketsPerUser *int
	trustedProxies                     *string
}

func guardFlags(fs *flag.FlagSet) *guardFlagSet {
	g := &guardFlagSet{
		hosts:          fs.String("allowed-hosts", "", "comma-separated host names the Host header may name, or * (default: the listen host, localhost, 127.0.0.1, ::1; any IP literal when listening on 0.0.0.0)"),
		origins:        fs.String("allowed-origins", "", "comma-separated origins (scheme://host[:port]) pages may call the API and open WebSockets from, or * (default: same origin on an allowed host)"),
		readHeader:     fs.Duration("read-header-timeout", httpapi.DefaultReadHeaderTimeout, "bound on reading a request's headers"),
		bodyRead:       fs.Duration("body-read-timeout", httpapi.DefaultBodyReadTimeout, "bound on reading a request's body (then 408, connection closed)"),
		idle:           fs.Duration("idle-timeout", httpapi.DefaultIdleTimeout, "close keep-alive connections idle this long"),
		ping:           fs.Duration("ws-ping-interval", httpapi.DefaultPingInterval, "WebSocket ping interval"),
		pong:           fs.Duration("ws-pong-timeout", httpapi.DefaultPongTimeout, "drop a WebSocket whose pong takes longer than this"),
		userRate:       fs.Float64("rate-user", httpapi.DefaultUserRate, "requests and WebSocket sends per second per user (negative: no limit)"),
		userBurst:      fs.Int("burst-user", httpapi.DefaultUserBurst, "requests at once per user"),
		ipRate:         fs.Float64("rate-ip", httpapi.DefaultIPRate, "API and WebSocket requests per second per client IP (negative: no limit)"),
		ipBurst:        fs.Int("burst-ip", httpapi.DefaultIPBurst, "requests at once per client IP"),
		socketsPerUser: fs.Int("ws-per-user", httpapi.DefaultSocketsPerUser, "open WebSockets per user (negative: no cap)"),
		trustedProxies: fs.String("trusted-proxies", "", "comma-separated CIDRs (or IPs) of the reverse proxies in front: from them the client IP is the rightmost untrusted X-Forwarded-For hop (default none: X-Forwarded-For is ignored)"),
	}
	return g
}

func (g *guardFlagSet) config() (httpapi.GuardConfig, error) {
	tp, err := httpapi.ParseTrustedProxies(*g.trustedProxies)
	if err != nil {
		return httpapi.GuardConfig{}, fmt.Errorf("--trusted-proxies: %w", err)
	}
	return httpapi.GuardConfig{
		AllowedHosts: cliflag.List(*g.hosts), AllowedOrigins: cliflag.List(*g.origins),
		ReadHeaderTimeout: *g.readHeader, BodyReadTimeout: *g.bodyRead, IdleTimeout: *g.idle,
		PingInterval: *g.ping, PongTimeout: *g.pong,
		UserRate: *g.userRate, UserBurst: *g.userBurst, IPRate: *g.ipRate, IPBurst: *g.ipBurst,
		SocketsPerUser: *g.socketsPerUser, TrustedProxies: tp,
	}, nil
}

// authFlagSet holds serve's authentication flags (auth.Config).
type authFlagSet struct {
	secretFile, keysFile, eventKeys *string
	tlsCert, tlsKey                 *string
	insecure                        *bool
}

func authFlags(fs *flag.FlagSet) *authFlagSet {
	return &authFlagSet{
		secretFile: cliflag.EnvString(fs, "jwt-secret-file", "OUTBOXCHAT_JWT_SECRET_FILE", "file holding the HS256 secret of bearer tokens, ≥ 32 bytes (default $OUTBOXCHAT_JWT_SECRET_FILE)"),
		keysFile:   fs.String("jwt-keys-file", "", "JWKS file of RS256/EdDSA public keys of bearer tokens"),
		insecure:   fs.Bool("insecure-no-auth", false, "serve the API without authentication (anyone reaching it reads and writes every chat)"),
		tlsCert:    fs.String("tls-cert", "", "PEM certificate (chain) file: serve HTTPS and WSS (with --tls-key)"),
		tlsKey:     fs.String("tls-key", "", "PEM private key file of --tls-cert"),
		eventKeys:  cliflag.EnvString(fs, "event-key-file", "OUTBOXCHAT_EVENT_KEY_FILE", "HMAC keys signing and checking stream entries, lines \"<consumers-to-workers|workers-to-consumers> <hex key>\" (default $OUTBOXCHAT_EVENT_KEY_FILE; none: entries unsigned)"),
	}
}

func (a *authFlagSet) config() auth.Config {
	return auth.Config{SecretFile: *a.secretFile, KeysFile: *a.keysFile, Insecure: *a.insecure}
}

// relayLinger maps --relay-linger to server.RelayConfig.Linger, whose 0 is
// the default: the flag's 0 (off) is a negative Linger.
func relayLinger(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}
