package chat

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/chat/web"
	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/internal/notifier"
	"github.com/outboxchat/outboxchat/internal/service"
	"github.com/outboxchat/outboxchat/outbox"
	"github.com/outboxchat/outboxchat/redisq"
)

// Roles a service process can run.
const (
	RoleAPI    = "api"    // HTTP API, WebSocket gateway and chat page
	RoleRelay  = "relay"  // outbox → Redis stream
	RoleWorker = "worker" // Redis stream → inbox
)

// Modes of the send path.
const (
	// ModeOutbox (v2): message and outbox row in one transaction; the relay
	// publishes.
	ModeOutbox = "v2"
	// ModeDualWrite (v1, the write-up's naive first version, for the lab
	// only): insert the message, then add the job to Redis from the API
	// process, keeping failed adds in memory to retry — lost on a redeploy.
	ModeDualWrite = "v1"
)

// Config configures Serve. Zero fields mean defaults.
type Config struct {
	// Service is Consumers or Workers. Required.
	Service string
	// Roles to run; nil or empty means all three.
	Roles []string
	// DatabaseURL is the service role's Postgres URL. Required. Behind a
	// pooler in transaction mode it needs default_query_exec_mode=exec
	// (ErrTransactionPooler; pooler.go).
	DatabaseURL string
	// ListenDatabaseURL is the URL of the process's one LISTEN connection
	// (the relay's and the gateway's wake-ups): a direct or session-mode
	// URL of the same database when DatabaseURL goes through a
	// transaction-mode pooler, which cannot deliver notifications. Default
	// "": DatabaseURL. Only its connection settings are used (pool_*
	// parameters are ignored).
	ListenDatabaseURL string
	// RedisURL is the Redis URL. Required for the relay and worker roles and
	// for ModeDualWrite.
	RedisURL string
	// HTTPAddr is the API's listen address. Default "127.0.0.1:8080" for
	// consumers and "127.0.0.1:8081" for workers.
	HTTPAddr string
	// Mode is ModeOutbox (default) or ModeDualWrite.
	Mode string
	// Wake is the outbox wake-up mode. Default outbox.WakeAfterCommit.
	Wake outbox.WakeMode
	// PollOnly turns the relay's LISTEN off (poll every PollInterval).
	PollOnly bool
	// PollInterval is the relay's poll fallback. Default 1 s.
	PollInterval time.Duration
	// LockDuration is how long a job may stay unacknowledged before another
	// worker may take it (stalled job). Default redisq.DefaultLockDuration.
	LockDuration time.Duration
	// GapTimeout is how long the WebSocket gateway holds received messages
	// behind a missing seq (a job still in flight or being reclaimed).
	// Default 0 means 2×LockDuration: a stalled job is reclaimed within about
	// 1.5×LockDuration (lock duration plus half of it between claim passes);
	// with the re-drive on, at least RedriveAfter plus the re-drive's pass
	// interval plus 1 s (a message lost in Redis comes back that late).
	// Negative: no hold, messages are pushed as they arrive (the write-up's
	// naive v1 receiver).
	GapTimeout time.Duration
	// RedriveAfter is how long a sent message may go without the other
	// side's receipt before the relay role's Redriver publishes it again
	// (redrive.go). Default 0 means 2×LockDuration (a job that is only
	// stalled is reclaimed within about 1.5×LockDuration, so it is not
	// re-driven); negative turns the re-drive off.
	RedriveAfter time.Duration
	// ConsumerName names this worker in the consumer group; it must be
	// stable across restarts of one instance so a restarted worker finishes
	// its own pending jobs first. Default "<service>-<hostname>".
	ConsumerName string
	// MaxBodyBytes limits a message body. Default DefaultMaxBodyBytes.
	MaxBodyBytes int
	// SendLockTimeout bounds a send's wait for its chat's lock (another
	// session holds it); past it the send answers 503 and stores nothing.
	// Default DefaultSendLockTimeout (2 s).
	SendLockTimeout time.Duration
	// ReadTimeout bounds each history read; past it the request answers
	// 503. Default DefaultReadTimeout (5 s).
	ReadTimeout time.Duration
	// RedisPrefix prefixes every Redis key (several deployments on one
	// Redis). Default DefaultRedisPrefix.
	RedisPrefix string
	// Auth says how the API authenticates requests (auth.go). A process
	// with the api role refuses to start unless it has a key or
	// Auth.Insecure is set (ErrNoAuth).
	Auth AuthConfig
	// EventKeyFile holds the HMAC keys that sign outbound stream entries and
	// verify inbound ones (ReadEventKeys). "" means entries are neither
	// signed nor checked: anyone who can write to Redis can forge messages.
	EventKeyFile string
	// TLSCertFile and TLSKeyFile (PEM), when both set, make the API serve
	// HTTPS and WSS only. Default "": plain HTTP (put a TLS-terminating
	// proxy in front, or keep it on a private network).
	TLSCertFile, TLSKeyFile string
	// Guard bounds what one client can take: timeouts, host and origin
	// allow-lists, rate limits, the WebSocket cap (guard.go).
	Guard GuardConfig
	// RelayMaxAttempts is how many failures of its own a row may have
	// before the relay parks it (outbox.RelayConfig.MaxAttempts). Default
	// 0 means outbox.DefaultMaxAttempts (10); negative: never park.
	RelayMaxAttempts int
	// DeadLetterMax caps the dead-letter stream this service's worker
	// writes (redisq.ConsumerConfig.DeadLetterMax). Default 0 means
	// redisq.DefaultDeadLetterMax (100,000); negative: no cap.
	DeadLetterMax int64
	// OutboxVacuumRows is the dead-row count of the outbox from which the
	// relay role vacuums it (outbox.Vacuum). Default 0 means
	// outbox.DefaultVacuumDeadRows (5,000); negative: never (autovacuum
	// only).
	OutboxVacuumRows int64
	// ShutdownDelay is how long, after ctx ends (SIGTERM), the API keeps
	// serving while /readyz answers 503 {"status": "stopping"}, so a load
	// balancer that probes it stops sending new requests before the
	// listener closes. Default 0: /readyz turns not ready and the listener
	// closes at once (a probe then finds the port closed). Set it to a
	// little more than the balancer's probe interval × failure threshold.
	ShutdownDelay time.Duration
	// Hooks wraps the relay's publisher and the worker's source and handler
	// (the lab's fault injection, tests); nil means none.
	Hooks Hooks
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// Listening, when set, is called with the bound HTTP address.
	Listening func(addr string)

	// Test hooks (package tests only).
	// onSelfCheck sees each LISTEN self-check's outcome.
	onSelfCheck func(ok bool)
	// gatewayPoll is the gateway's PollInterval (0: its default).
	gatewayPoll time.Duration
}

// DefaultRedisPrefix is Config.RedisPrefix's default.
const DefaultRedisPrefix = "outboxchat:"

// QueueName is the Redis queue carrying messages from service from to its peer.
func QueueName(from string) string { return from + "-to-" + Peer(from) }

func (c *Config) has(role string) bool {
	if len(c.Roles) == 0 {
		return true
	}
	for _, r := range c.Roles {
		if r == role {
			return true
		}
	}
	return false
}

// ParseRoles parses "api,relay,worker" (any subset, any order).
func ParseRoles(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	var out []string
	for _, r := range strings.Split(s, ",") {
		r = strings.TrimSpace(r)
		switch r {
		case RoleAPI, RoleRelay, RoleWorker:
			out = append(out, r)
		default:
			return nil, fmt.Errorf("unknown role %q (want api, relay, worker)", r)
		}
	}
	return out, nil
}

// Serve runs one service process until ctx is done, then stops gracefully.
// Migrations are applied at start. The stop, in order (README "Graceful
// shutdown"):
//
//  1. /readyz answers 503 {"status": "stopping"}; the API keeps serving for
//     Config.ShutdownDelay (default 0).
//  2. The listener closes; HTTP requests in flight finish: each send
//     answers 201 with its row committed, or an error with no row.
//  3. Every WebSocket is closed with 1001 (going away), so clients
//     reconnect, elsewhere, with their cursors.
//  4. The other services stop in the reverse of their start
//     (internal/service; steps 1–4 within stopTimeout, 15 s, in all): the
//     send path's group committer, the gateway,
//     the relay (it finishes its pass: published rows are marked sent),
//     the worker (it finishes its batch, commits and acks it; a batch
//     still failing is left pending for the queue to hand out again), the
//     LISTEN connection.
//
// It returns nil after a stop caused by ctx, or the error that kept it
// from starting.
func Serve(ctx context.Context, cfg Config) error {
	if err := checkService(cfg.Service); err != nil {
		return err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("service", cfg.Service)
	if cfg.Mode == "" {
		cfg.Mode = ModeOutbox
	}
	if cfg.Mode != ModeOutbox && cfg.Mode != ModeDualWrite {
		return fmt.Errorf("unknown mode %q (want v1 or v2)", cfg.Mode)
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.RedisPrefix == "" {
		cfg.RedisPrefix = DefaultRedisPrefix
	}
	if cfg.HTTPAddr == "" {
		cfg.HTTPAddr = map[string]string{Consumers: "127.0.0.1:8080", Workers: "127.0.0.1:8081"}[cfg.Service]
	}
	if cfg.ConsumerName == "" {
		host, _ := os.Hostname()
		cfg.ConsumerName = cfg.Service + "-" + host
	}
	var (
		eventKeys *EventKeys
		err       error
	)
	if cfg.EventKeyFile != "" {
		if eventKeys, err = ReadEventKeys(cfg.EventKeyFile); err != nil {
			return fmt.Errorf("serve: %w", err)
		}
	} else if cfg.has(RoleWorker) || cfg.has(RoleRelay) {
		log.Warn("stream entries are not signed (no --event-key-file): anyone who can write to Redis can forge messages")
	}
	var verifier *Verifier
	if cfg.has(RoleAPI) {
		if verifier, err = NewVerifier(cfg.Service, cfg.Auth); err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		if verifier == nil {
			log.Warn("AUTHENTICATION IS OFF (--insecure-no-auth): anyone who can reach " + cfg.HTTPAddr +
				" can read and write every chat; use this only on a closed network")
		}
	}
	if cfg.DatabaseURL == "" {
		return errors.New("serve: no database URL (--database-url or DATABASE_URL)")
	}
	pcfg, err := poolConfig(cfg.DatabaseURL)
	if err != nil {
		return err
	}
	// plan_cache_mode per session, not as a startup parameter, which
	// poolers refuse (pooler.go).
	setPlan := planCacheSetup(pcfg)
	// The backend pids of this process's pool, so the notifier can tell its
	// own notifications from other processes'. (Through a pooler they are
	// the pooler's, so none matches: own notifications then cost the
	// gateway and relay one redundant read each.)
	var ownBackends sync.Map // uint32 → struct{}
	pcfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		ownBackends.Store(c.PgConn().PID(), struct{}{})
		if setPlan != "" {
			if _, err := c.Exec(ctx, setPlan); err != nil {
				return fmt.Errorf("set plan_cache_mode: %w", err)
			}
		}
		return nil
	}
	pcfg.BeforeClose = func(c *pgx.Conn) { ownBackends.Delete(c.PgConn().PID()) }
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("serve: connect postgres: %w", err)
	}
	defer pool.Close()
	log.Info("database pool", "max_conns", pcfg.MaxConns, "min_conns", pcfg.MinConns)
	if err := CheckPooler(ctx, pool, log); err != nil {
		return err
	}
	if n, err := Migrate(ctx, pool, cfg.Service); err != nil {
		return fmt.Errorf("serve: %w", err)
	} else if n > 0 {
		log.Info("migrations applied", "count", n)
	}

	var rdb *redis.Client
	needRedis := cfg.has(RoleRelay) || cfg.has(RoleWorker) || (cfg.Mode == ModeDualWrite && cfg.has(RoleAPI))
	if needRedis {
		if cfg.RedisURL == "" {
			return errors.New("serve: no redis URL (--redis-url or REDIS_URL)")
		}
		if rdb, err = redisq.NewClient(cfg.RedisURL); err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		defer rdb.Close()
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if err := redisq.CheckDurability(cctx, rdb, log); err != nil && !errors.Is(err, redisq.ErrNotDurable) {
			log.Warn("could not check redis durability (redis down?); continuing", "err", err)
		}
		cancel()
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		newHorizonCollector(pool))
	if cfg.has(RoleRelay) || cfg.has(RoleWorker) {
		// The outbox gauges where the relay runs, the queue's where the
		// worker does (status.go).
		var db outbox.DB
		if cfg.has(RoleRelay) {
			db = pool
		}
		var qr redis.UniversalClient
		if cfg.has(RoleWorker) {
			qr = rdb
		}
		reg.MustRegister(newStatusCollector(db, qr, cfg.RedisPrefix, cfg.Service))
	}
	// The services of the chosen roles, in start order (runServices starts
	// them in order and stops them in reverse): notifier, inbox consumer,
	// relay, redriver, writer, gateway, store, dual writer, HTTP server.
	// Everything is built before anything starts, so a bad setting fails
	// with nothing running.
	var services []service.Service
	add := func(svc service.Service) { services = append(services, svc) }
	// Log lines saying a role started (the lab waits for "relay started"),
	// written once every service has.
	var announce []func()
	announced := func() {
		for _, f := range announce {
			f()
		}
	}

	wcfg := &outbox.WriterConfig{
		Table: cfg.Service + ".outbox", Channel: OutboxChannel(cfg.Service), Mode: cfg.Wake, Logger: log,
	}
	if cfg.directRelayWake() {
		// The relay of this process is woken directly (below); the NOTIFY
		// only wakes other processes' relays and gateways, which can wait a
		// few milliseconds under load.
		wcfg.NotifyInterval = notifyInterval
	}
	writer, err := outbox.NewWriter(pool, wcfg)
	if err != nil {
		return err
	}

	// One LISTEN connection for the process: the relay and the gateway
	// subscribe to it by channel. Started first, stopped last (after them).
	var listener *notifier.Notifier
	if cfg.has(RoleAPI) || (cfg.has(RoleRelay) && cfg.Mode == ModeOutbox && !cfg.PollOnly) {
		lcc, err := listenConnConfig(cfg.ListenDatabaseURL, pool)
		if err != nil {
			return err
		}
		selfCheckOK := prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outboxchat_listen_selfcheck_ok",
			Help: "1 when the latest start-up self-check's NOTIFY reached this process's LISTEN connection; 0 before it passed or when it failed (a transaction-mode pooler: set --listen-database-url).",
		})
		reg.MustRegister(selfCheckOK)
		listener, err = notifier.New(&notifier.Config{
			ConnConfig: lcc, Logger: log,
			Own:          func(pid uint32) bool { _, own := ownBackends.Load(pid); return own },
			SelfCheckFix: "set --listen-database-url (LISTEN_DATABASE_URL) to a direct or session-mode URL of the same database",
			OnSelfCheck: func(ok bool) {
				selfCheckOK.Set(map[bool]float64{false: 0, true: 1}[ok])
				if cfg.onSelfCheck != nil {
					cfg.onSelfCheck(ok)
				}
			},
		})
		if err != nil {
			return err
		}
		add(listener)
	}

	// The gateway exists before the worker, which hands it every inbox
	// commit (Offer); it starts with the API below.
	var gw *Gateway
	if cfg.has(RoleAPI) {
		if cfg.GapTimeout == 0 {
			lock := cfg.LockDuration
			if lock <= 0 {
				lock = redisq.DefaultLockDuration
			}
			cfg.GapTimeout = 2 * lock
			// A message lost in Redis comes back by the sender's re-drive,
			// at most RedriveAfter plus one pass interval after it was
			// sent: hold the ones behind it that long, so the room keeps
			// its order.
			if after := cfg.redriveAfter(); after > 0 {
				cfg.GapTimeout = max(cfg.GapTimeout, after+redriveInterval(after)+time.Second)
			}
		}
		// This process's sends and inbox commits are offered to the gateway
		// directly (Store.afterCommit, inbox.Config.AfterCommit): drop
		// their notifications; other processes' arrive through LISTEN.
		skip := []string{OutboxChannel(cfg.Service)}
		if cfg.has(RoleWorker) {
			skip = append(skip, InboxChannel(cfg.Service), ReceiptChannel(cfg.Service))
		}
		gw, err = NewGateway(pool, cfg.Service, &GatewayConfig{
			Channels:   []string{InboxChannel(cfg.Service), OutboxChannel(cfg.Service), ReceiptChannel(cfg.Service)},
			GapTimeout: cfg.GapTimeout, Logger: log, Notifier: listener, SkipOwnOn: skip, PollInterval: cfg.gatewayPoll,
		})
		if err != nil {
			return err
		}
	}

	var wakeRelay atomic.Value // func(): the relay's Wake, once it exists

	// Worker: stream → inbox. Started first at stop time last: it must
	// finish and ack its batch before connections close.
	if cfg.has(RoleWorker) {
		h, err := NewInboxHandler(cfg.Service)
		if err != nil {
			return err
		}
		if eventKeys != nil {
			h.RequireSignatures(eventKeys)
		}
		qc, err := redisq.NewConsumer(rdb, &redisq.ConsumerConfig{
			Queue: QueueName(Peer(cfg.Service)), Prefix: cfg.RedisPrefix, Group: cfg.Service,
			Consumer: cfg.ConsumerName, LockDuration: cfg.LockDuration, Logger: log, DeadLetterMax: cfg.DeadLetterMax,
			OnEvent: opsQueueEvents(reg, queueEvents(reg, log, cmp.Or(cfg.LockDuration, redisq.DefaultLockDuration))),
		})
		if err != nil {
			return err
		}
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "outboxchat_queue_deleted_pending_total",
			Help: "Pending stream entries found deleted from the stream (lost in Redis; healed by the sender's re-drive).",
		}, func() float64 { return float64(qc.DeletedPending()) }))
		var src inbox.Source = redisq.InboxSource(qc)
		var handler inbox.Handler = h
		if cfg.Hooks != nil {
			src, handler = cfg.Hooks.Source(src), cfg.Hooks.Handler(handler)
		}
		icfg := &inbox.Config{Logger: log, OnEvent: inboxEvents(reg, log)}
		// The inbox transaction enqueued a receipt in this service's
		// outbox: wake this process's relay for it, at most once per
		// receiptWakeDelay, so that under load one relay pass carries the
		// receipts of many inbox batches (another process's relay finds
		// them at its next wake-up or poll).
		var wakePending atomic.Bool
		observeE2E := e2eMetric(reg)
		icfg.AfterCommit = func(applied []inbox.Applied) {
			observeE2E(applied)
			if gw != nil {
				gw.offerApplied(applied)
			}
			if f, ok := wakeRelay.Load().(func()); ok && wakePending.CompareAndSwap(false, true) {
				time.AfterFunc(receiptWakeDelay, func() { wakePending.Store(false); f() })
			}
		}
		ic, err := inbox.NewConsumer(pool, src, handler, icfg)
		if err != nil {
			return err
		}
		add(ic)
		announce = append(announce, func() {
			log.Info("worker started", "queue", QueueName(Peer(cfg.Service)), "consumer", cfg.ConsumerName)
		})
	}

	pubConfig := &redisq.PublisherConfig{Queue: QueueName(cfg.Service), Prefix: cfg.RedisPrefix, Logger: log}
	if eventKeys != nil {
		pubConfig.Sign = eventKeys.Signer(QueueName(cfg.Service))
	}
	var relayWake func()
	if cfg.has(RoleRelay) && cfg.Mode == ModeOutbox {
		pub, err := redisq.NewPublisher(rdb, pubConfig)
		if err != nil {
			return err
		}
		p := redisq.OutboxPublisher(pub)
		if cfg.Hooks != nil {
			p = cfg.Hooks.Publisher(p)
		}
		rcfg := &outbox.RelayConfig{
			Table: cfg.Service + ".outbox", Channel: OutboxChannel(cfg.Service), Publisher: p,
			PollInterval: cfg.PollInterval, DisableListen: cfg.PollOnly, Logger: log,
			OnEvent: opsRelayEvents(reg, relayEvents(reg, log)), Notifier: listener, MaxAttempts: cfg.RelayMaxAttempts,
			// This process's sends wake the relay directly; their NOTIFYs
			// (for other processes) would only cause a second pass here.
			SkipOwnNotifications: cfg.directRelayWake(),
		}
		relay, err := outbox.NewRelay(pool, rcfg)
		if err != nil {
			return err
		}
		add(relay)
		add(newHeartbeat(pool, cfg.Service, cfg.ConsumerName, relay.LastPass, log))
		if cfg.OutboxVacuumRows >= 0 {
			vac, err := outbox.NewVacuum(pool, &outbox.VacuumConfig{Table: cfg.Service + ".outbox", DeadRows: cfg.OutboxVacuumRows, Logger: log})
			if err != nil {
				return err
			}
			add(vac)
		}
		if after := cfg.redriveAfter(); after > 0 {
			redriven := prometheus.NewCounter(prometheus.CounterOpts{
				Name: "outboxchat_redriven_total",
				Help: "Messages published again because no receipt came back within --redrive-after.",
			})
			reg.MustRegister(redriven)
			rd, err := NewRedriver(pool, cfg.Service, pub, &RedriveConfig{
				After: after, Logger: log, Redriven: func(n int) { redriven.Add(float64(n)) },
			})
			if err != nil {
				return err
			}
			add(rd)
			announce = append(announce, func() { log.Info("re-drive started", "after", after) })
		}
		relayWake = relay.Wake
		if !cfg.PollOnly {
			// Poll-only means the relay moves at its poll alone: an inbox
			// commit's receipt wake-up would publish this process's
			// pending messages too (lab latency's v2-poll measured
			// 50 ms, the receipt wake delay, instead of the poll).
			wakeRelay.Store(relayWake)
		}
		announce = append(announce, func() {
			log.Info("relay started", "queue", QueueName(cfg.Service), "poll_only", cfg.PollOnly)
		})
	}

	if !cfg.has(RoleAPI) {
		return runServices(ctx, log, services, announced)
	}

	add(writer)
	store, err := NewStore(pool, cfg.Service, writer)
	if err != nil {
		return err
	}
	if cfg.SendLockTimeout > 0 {
		store.lockTimeout = cfg.SendLockTimeout
	}
	if cfg.ReadTimeout > 0 {
		store.readTimeout = cfg.ReadTimeout
	}
	store.metrics = sendMetrics(reg)
	add(gw)
	store.afterCommit = func(ms []Message) { gw.Offer(false, ms) }
	if relayWake != nil && cfg.directRelayWake() {
		// In the after-commit mode the relay in this process is woken
		// directly, a round trip sooner than through its LISTEN; the NOTIFY
		// still wakes relays elsewhere. The other modes are left to measure
		// what they are (in-tx NOTIFY, poll only).
		store.afterCommit = func(ms []Message) { relayWake(); gw.Offer(false, ms) }
	}
	add(store)
	api := &API{store: store, gateway: gw, service: cfg.Service, maxBody: cfg.MaxBodyBytes, log: log, closing: make(chan struct{})}
	if cfg.Mode == ModeDualWrite {
		pub, err := redisq.NewPublisher(rdb, pubConfig)
		if err != nil {
			return err
		}
		dw := newDualWriter(store, pub, log)
		add(dw)
		api.onSend = dw.send
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "outboxchat_ws_subscribers", Help: "Live WebSocket subscribers.",
	}, func() float64 { return float64(gw.Subscribers()) }))

	guard, err := newGuard(cfg.Guard, cfg.HTTPAddr, int64(cfg.MaxBodyBytes)*6+1024, log)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	api.guard = guard
	api.verifier = verifier
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "outboxchat_http_refused_total", Help: "Requests refused by the connection guard, by reason (host, origin, too_large, rate_ip, rate_user, sockets).",
	}, []string{"reason"})
	for _, r := range []string{"host", "origin", "too_large", "body_timeout", "rate_ip", "rate_user", "sockets"} {
		refused.WithLabelValues(r) // export zeros
	}
	reg.MustRegister(refused)
	guard.refused = func(reason string) { refused.WithLabelValues(reason).Inc() }
	api.ws = newWSMetrics(reg)

	mux := http.NewServeMux()
	api.Register(mux)
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /openapi.json", serveOpenAPI)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	var stopping atomic.Bool // set first thing when ctx ends
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if stopping.Load() {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "stopping", "error": "service stopping", "field": ""})
			return
		}
		pctx, cancel := context.WithTimeout(r.Context(), time.Second)
		defer cancel()
		if err := pool.Ping(pctx); err != nil {
			log.Warn("readyz: database unreachable", "err", err)
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "database unavailable", "error": "database unavailable", "field": ""})
			return
		}
		// The roles that need Redis (relay, worker; the v1 API) cannot do
		// their work without it: not ready, and say which and why.
		if rdb != nil {
			if err := rdb.Ping(pctx).Err(); err != nil {
				writeJSON(w, http.StatusServiceUnavailable, map[string]string{
					"status": "redis unavailable", "roles": strings.Join(cfg.redisRoles(), ","), "error": err.Error(),
				})
				return
			}
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	mux.Handle("GET /{$}", web.Handler(cfg.Service))

	if (cfg.TLSCertFile == "") != (cfg.TLSKeyFile == "") {
		return errors.New("serve: give both --tls-cert and --tls-key, or neither")
	}
	var tlsConfig *tls.Config
	if cfg.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCertFile, cfg.TLSKeyFile)
		if err != nil {
			return fmt.Errorf("serve: tls: %w", err)
		}
		tlsConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("serve: listen %s: %w", cfg.HTTPAddr, err)
	}
	if tlsConfig != nil {
		ln = tls.NewListener(ln, tlsConfig)
	}
	defer ln.Close() // when a service fails to start, the server never served it
	gc := guard.cfg
	// Outermost first: connection checks (host, origin, per-IP rate, body
	// size and deadline), then the token, then the per-user rate.
	srv := &http.Server{Handler: guard.wrap(authenticate(verifier, guard.limitUsers(httpMetrics(reg, withJSONErrors(mux))))), ReadHeaderTimeout: gc.ReadHeaderTimeout, IdleTimeout: gc.IdleTimeout,
		MaxHeaderBytes: maxHeaderBytes,
		// Failed TLS handshakes and the like: every scanner causes them.
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	add(&httpService{srv: srv, ln: ln, api: api, log: log, stopping: &stopping, delay: cfg.ShutdownDelay})
	return runServices(ctx, log, services, func() {
		announced()
		log.Info("listening", "addr", ln.Addr().String(), "mode", cfg.Mode, "wake", cfg.Wake.String(), "tls", tlsConfig != nil)
		if cfg.Listening != nil {
			cfg.Listening(ln.Addr().String())
		}
	})
}

// runServices starts svcs in order, calls up (when set) once all have
// started, waits for ctx to end and stops the started ones in reverse,
// gracefully (internal/service: Stop drains, then cancels), within
// stopTimeout in all. They are started with a context the signal does not
// cancel, because cancelling Start's ctx is a hard stop. A failed Start
// stops the ones before it and returns its error.
func runServices(ctx context.Context, log *slog.Logger, svcs []service.Service, up func()) error {
	runCtx := context.WithoutCancel(ctx)
	var started []service.Service
	defer func() {
		sctx, cancel := context.WithTimeout(runCtx, stopTimeout)
		defer cancel()
		for i := len(started) - 1; i >= 0; i-- {
			if err := started[i].Stop(sctx); err != nil {
				log.Warn("stop", "err", err)
			}
		}
	}()
	for _, svc := range svcs {
		if err := svc.Start(runCtx); err != nil {
			return err
		}
		started = append(started, svc)
	}
	if up != nil {
		up()
	}
	<-ctx.Done()
	log.Info("stopping")
	return nil
}

// stopTimeout bounds Serve's graceful stop of all its services.
const stopTimeout = 15 * time.Second

// redisRoles lists the roles of this process that need Redis.
func (c *Config) redisRoles() []string {
	var out []string
	for _, r := range []string{RoleRelay, RoleWorker} {
		if c.has(r) {
			out = append(out, r)
		}
	}
	if c.Mode == ModeDualWrite && c.has(RoleAPI) {
		out = append(out, RoleAPI+" (v1 dual write)")
	}
	return out
}

// redriveAfter is RedriveAfter with its default applied; <= 0 means off.
func (c *Config) redriveAfter() time.Duration {
	switch {
	case c.RedriveAfter < 0:
		return 0
	case c.RedriveAfter > 0:
		return c.RedriveAfter
	}
	lock := c.LockDuration
	if lock <= 0 {
		lock = redisq.DefaultLockDuration
	}
	return 2 * lock
}

// receiptWakeDelay is how long after an inbox commit this process's relay
// is woken for the receipt it enqueued: receipts of the batches committed
// meanwhile ride on the same relay pass. It delays "✓✓ delivered" by at
// most this much.
const receiptWakeDelay = 50 * time.Millisecond

// maxHeaderBytes bounds a request's headers (net/http's default is 1 MiB;
// a JWT and a few headers need a few KiB).
const maxHeaderBytes = 64 << 10

// notifyInterval spaces the post-commit NOTIFYs of a process whose own
// relay is woken directly (outbox.WriterConfig.NotifyInterval).
const notifyInterval = 5 * time.Millisecond

// directRelayWake reports whether sends wake this process's relay directly:
// in the after-commit mode with the API and relay roles in one process.
// The other modes are left to measure what they are (in-tx NOTIFY, poll
// only).
func (c *Config) directRelayWake() bool {
	return c.has(RoleAPI) && c.has(RoleRelay) && c.Mode == ModeOutbox &&
		c.Wake == outbox.WakeAfterCommit && !c.PollOnly
}
