package server

import (
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/auth"
	"github.com/outboxchat/outboxchat/chat/httpapi"
	"github.com/outboxchat/outboxchat/chat/receive"
	"github.com/outboxchat/outboxchat/outbox"
	"github.com/outboxchat/outboxchat/redisq"
)

// Roles a service process can run.
const (
	RoleAPI    = "api"    // HTTP API, WebSocket gateway and chat page
	RoleRelay  = "relay"  // outbox → Redis stream, re-drive
	RoleWorker = "worker" // Redis stream → inbox
)

// DefaultRelayLinger is the relays' outbox.RelayConfig.Linger unless
// RelayConfig.Linger says otherwise: under load a woken pass begins no
// sooner than this after the previous one began, so that it carries the
// rows committed meanwhile. The figure is the one measured best for CPU
// per message without a worse p99 (docs/PERFORMANCE.md, "A relay that
// lingers under load"); an idle relay never waits.
const DefaultRelayLinger = 10 * time.Millisecond

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

// Config configures Serve: what every role shares at the top, then one
// group per role. A zero field means its default (WithDefaults).
type Config struct {
	// Service is chat.Consumers or chat.Workers. Required.
	Service string
	// Roles to run; nil or empty means all three.
	Roles []string
	// Mode is ModeOutbox (default) or ModeDualWrite.
	Mode string
	// DatabaseURL is the service role's Postgres URL. Required. Behind a
	// pooler in transaction mode it needs default_query_exec_mode=exec
	// (schema.ErrTransactionPooler).
	DatabaseURL string
	// ListenDatabaseURL is the URL of the process's one LISTEN connection
	// (the relay's and the gateway's wake-ups): a direct or session-mode
	// URL of the same database when DatabaseURL goes through a
	// transaction-mode pooler, which cannot deliver notifications. Default
	// "": DatabaseURL. Only its connection settings are used (pool_*
	// parameters are ignored).
	ListenDatabaseURL string
	// RedisURL is the Redis URL. Required for the relay and worker roles
	// and for ModeDualWrite.
	RedisURL string
	// BrokerURL, when set, puts the queue between the services on NATS
	// JetStream (natsq) instead of Redis Streams: "nats://host:4222" (or
	// "tls://…"; a comma-separated list for a cluster's seeds). The relay
	// publishes into the stream "<prefix>_<service>-to-<peer>[_p<n>]" (the
	// prefix is RedisPrefix with ':' as '_') and the worker consumes its
	// peer's in a durable consumer named after the service. Redis stays
	// for what is not the queue: the seq fence's high-water marks, worker
	// presence, the live hub (typing, revoked tokens, rate limits); so
	// RedisURL is required all the same. Default "": Redis Streams on
	// RedisURL.
	BrokerURL string
	// BrokerReplicas is the replica count of the JetStream streams
	// (natsq.Config.Replicas): 3 on a three-node cluster. Default 0
	// means 1. Ignored without BrokerURL.
	BrokerReplicas int
	// RedisPrefix prefixes every Redis key (several deployments on one
	// Redis). Default chat.DefaultRedisPrefix.
	RedisPrefix string
	// RedisReplicaAcks, when above 0, makes the relay's adds (and the
	// re-drive's, and ModeDualWrite's) wait until that many replicas of
	// the queue's master have them (redisq.PublisherConfig.ReplicaAcks,
	// Redis WAIT, at most redisq.DefaultReplicaAckTimeout per script call
	// of up to 500 jobs): an outbox row is marked sent only once its entry
	// is on that many replicas, which, set to the replicas each master
	// has, a failover cannot lose. While the master has fewer replicas in
	// sync, rows wait in the outbox. Default 0: the master's answer alone;
	// a failover may then lose the last adds, which only the re-drive
	// (Relay.RedriveAfter) brings back.
	RedisReplicaAcks int
	// Partitions is the number of partitions per direction (chat.Partition):
	// each has its own outbox table, relay, Redis stream and consumer.
	// Both services must run with the same number. 1 is the layout
	// without partitions ("<service>.outbox", one stream per direction,
	// one relay per process); above 1, the relays are spread over the
	// relay processes by leases (Relay.LeaseTTL), and every worker
	// process consumes every partition's stream. Default
	// chat.DefaultPartitions (1); at most chat.MaxPartitions. Changing it
	// needs a drained deployment (docs/DEPLOYING.md).
	Partitions int
	// LockDuration is how long a job may stay unacknowledged before another
	// worker may take it (stalled job); the gateway's hold and the
	// re-drive's delay default from it. Default redisq.DefaultLockDuration.
	LockDuration time.Duration
	// EventKeyFile holds the HMAC keys that sign outbound stream entries
	// and verify inbound ones (auth.ReadEventKeys). "" means entries are
	// neither signed nor checked: anyone who can write to Redis can forge
	// messages.
	EventKeyFile string
	// Hooks wraps the relay's publisher and the worker's source and handler
	// (the lab's fault injection, tests); nil means none.
	Hooks Hooks
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// TracerProvider, when set, records the spans of every message's way
	// (HTTP send, send transaction, relay publish, inbox store, receipt,
	// gateway push; see chat/server/internal/tracing) and carries the W3C
	// trace context in the event headers. The caller owns it (shuts it down
	// after Serve returns). Default nil: tracing off, no span, no header, none of the
	// wrappers (telemetry.FromEnv returns nil when no OTEL_* variable is
	// set).
	TracerProvider trace.TracerProvider

	// API configures the api role.
	API APIConfig
	// Relay configures the relay role.
	Relay RelayConfig
	// Worker configures the worker role.
	Worker WorkerConfig

	// Test hooks (package tests only).
	// onSelfCheck sees each LISTEN self-check's outcome.
	onSelfCheck func(ok bool)
	// gatewayPoll is the gateway's PollInterval (0: its default).
	gatewayPoll time.Duration
	// gatherer receives the process's metrics registry (a process without
	// the api role serves no /metrics).
	gatherer func(prometheus.Gatherer)
	// kill, when closed, hard-stops every service of the process (their
	// Start contexts are cancelled, as if the process died): nothing is
	// released, leases expire. Serve still returns only when its ctx
	// ends.
	kill chan struct{}
}

// APIConfig configures the api role: the HTTP API, the WebSocket gateway,
// the chat page and the send path.
type APIConfig struct {
	// HTTPAddr is the listen address. Default "127.0.0.1:8080" for
	// consumers and "127.0.0.1:8081" for workers.
	HTTPAddr string
	// Wake is the outbox wake-up mode of sends. Default
	// outbox.WakeAfterCommit.
	Wake outbox.WakeMode
	// MaxBodyBytes limits a message body. Default chat.DefaultMaxBodyBytes.
	MaxBodyBytes int
	// SendLockTimeout bounds a send's wait for its chat's lock (another
	// session holds it); past it the send answers 503 and stores nothing.
	// Default store.DefaultSendLockTimeout (2 s).
	SendLockTimeout time.Duration
	// ReadTimeout bounds each history read; past it the request answers
	// 503. Default store.DefaultReadTimeout (5 s).
	ReadTimeout time.Duration
	// GapTimeout is how long the WebSocket gateway holds received messages
	// behind a missing seq (a job still in flight or being reclaimed).
	// Default 2 × LockDuration (a stalled job is reclaimed within about
	// 1.5 × LockDuration: the lock duration plus half of it between claim
	// passes); with the re-drive on, at least Relay.RedriveAfter plus the
	// re-drive's pass interval plus 1 s (a message lost in Redis comes back
	// that late). Negative: no hold, messages are pushed as they arrive
	// (the write-up's naive v1 receiver).
	GapTimeout time.Duration
	// Auth says how the API authenticates requests. A process with the api
	// role refuses to start unless it has a key or Auth.Insecure is set
	// (auth.ErrNoAuth).
	Auth auth.Config
	// TLSCertFile and TLSKeyFile (PEM), when both set, make the API serve
	// HTTPS and WSS only. Default "": plain HTTP (put a TLS-terminating
	// proxy in front, or keep it on a private network).
	TLSCertFile, TLSKeyFile string
	// Guard bounds what one client can take: timeouts, host and origin
	// allow-lists, rate limits, the WebSocket cap.
	Guard httpapi.GuardConfig
	// ShutdownDelay is how long, after ctx ends (SIGTERM), the API keeps
	// serving while /readyz answers 503 {"status": "stopping"}, so a load
	// balancer that probes it stops sending new requests before the
	// listener closes. Default 0: /readyz turns not ready and the listener
	// closes at once. Set it to a little more than the balancer's probe
	// interval × failure threshold.
	ShutdownDelay time.Duration
	// Listening, when set, is called with the bound HTTP address once
	// every service of the process has started.
	Listening func(addr string)
}

// RelayConfig configures the relay role: the outbox relay, its vacuum and
// heartbeat, and the re-drive.
type RelayConfig struct {
	// PollOnly turns the relay's LISTEN off (poll every PollInterval).
	PollOnly bool
	// PollInterval is the relay's poll fallback. Default 1 s
	// (outbox.DefaultPollInterval).
	PollInterval time.Duration
	// Linger is the relays' outbox.RelayConfig.Linger (messages' and
	// receipts'). Default 0 means DefaultRelayLinger; negative: none.
	Linger time.Duration
	// RedriveAfter is how long a sent message may go without the other
	// side's receipt before the Redriver publishes it again. Default
	// 2 × LockDuration (a job that is only stalled is reclaimed within
	// about 1.5 × LockDuration, so it is not re-driven); negative turns the
	// re-drive off.
	RedriveAfter time.Duration
	// MaxAttempts is how many failures of its own a row may have before
	// the relay parks it (outbox.RelayConfig.MaxAttempts). Default 0 means
	// outbox.DefaultMaxAttempts (10); negative: never park.
	MaxAttempts int
	// OutboxVacuumRows is the dead-row count of the outbox from which the
	// relay role vacuums it (outbox.Vacuum). Default 0 means
	// outbox.DefaultVacuumDeadRows (5,000); negative: never (autovacuum
	// only).
	OutboxVacuumRows int64
	// LeaseTTL is how long a partition lease lasts unless renewed (with
	// Partitions above 1): renewals run every LeaseTTL/3, and a killed
	// process's partitions are taken over by the others within about
	// LeaseTTL + LeaseTTL/3. Default lease.DefaultTTL (10 s); at least
	// 300 ms.
	LeaseTTL time.Duration
	// HistoryRetention, above 0, makes the relay role delete the service's
	// history older than it every minute (messages, inbox rows, receipts,
	// gap fills, duplicates; prune.Run says what is always kept). Default
	// 0: keep everything.
	HistoryRetention time.Duration
}

// WorkerConfig configures the worker role: the inbox consumer of the
// stream from the peer.
type WorkerConfig struct {
	// ConsumerName names this worker in the consumer group (and its relay's
	// heartbeat row). Two live processes must not share one: they would
	// share one pending list (each is warned, and `outboxchat status` and
	// outboxchat_consumer_name_shared show it). Default "": at start the
	// process claims "<service>-<hostname>-<n>", the lowest n that no live
	// process of the group holds (chat/presence: Process.Claim), so a process
	// replacing one that stopped gets its name and finishes its pending
	// entries first; with Redis down at start, "<service>-<hostname>-p<pid>".
	// Without the worker role it only names the relay's heartbeat row:
	// default "<service>-<hostname>-relay".
	ConsumerName string
	// DeadLetterMax caps the dead-letter stream this worker writes
	// (redisq.ConsumerConfig.DeadLetterMax). Default 0 means
	// redisq.DefaultDeadLetterMax (100,000); negative: no cap.
	DeadLetterMax int64
}

// ParseRoles parses "api,relay,worker" (any subset, any order; "" means
// nil: all roles). Error: an unknown role.
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

// WithDefaults returns a copy of c in which every zero field that has a
// default holds it: Roles all three, Mode ModeOutbox, RedisPrefix,
// LockDuration, Logger, API.HTTPAddr (by service), API.MaxBodyBytes,
// API.GapTimeout, Relay.RedriveAfter (Worker.ConsumerName is claimed at
// start, see WorkerConfig). Fields whose
// default is applied by the component they configure (timeouts, relay and
// dead-letter limits) are left for it. Relay.RedriveAfter comes out ≤ 0
// when the re-drive is off.
func (c *Config) WithDefaults() *Config {
	d := *c
	if len(d.Roles) == 0 {
		d.Roles = []string{RoleAPI, RoleRelay, RoleWorker}
	}
	d.Mode = cmp.Or(d.Mode, ModeOutbox)
	d.Partitions = cmp.Or(d.Partitions, chat.DefaultPartitions)
	d.RedisPrefix = cmp.Or(d.RedisPrefix, chat.DefaultRedisPrefix)
	if d.LockDuration <= 0 {
		d.LockDuration = redisq.DefaultLockDuration
	}
	d.Logger = cmp.Or(d.Logger, slog.Default())
	if d.API.HTTPAddr == "" {
		d.API.HTTPAddr = map[string]string{chat.Consumers: "127.0.0.1:8080", chat.Workers: "127.0.0.1:8081"}[d.Service]
	}
	if d.API.MaxBodyBytes <= 0 {
		d.API.MaxBodyBytes = chat.DefaultMaxBodyBytes
	}
	if d.Relay.RedriveAfter == 0 {
		d.Relay.RedriveAfter = 2 * d.LockDuration
	}
	if d.API.GapTimeout == 0 {
		d.API.GapTimeout = 2 * d.LockDuration
		// A message lost in Redis comes back by the sender's re-drive, at
		// most RedriveAfter plus one pass interval after it was sent: hold
		// the ones behind it that long, so the room keeps its order.
		if after := d.Relay.RedriveAfter; after > 0 {
			d.API.GapTimeout = max(d.API.GapTimeout, after+receive.RedriveInterval(after)+time.Second)
		}
	}
	return &d
}

// validate checks the service and the mode of a config that went through
// WithDefaults.
func (c *Config) validate() error {
	if err := chat.CheckService(c.Service); err != nil {
		return err
	}
	if c.Mode != ModeOutbox && c.Mode != ModeDualWrite {
		return fmt.Errorf("unknown mode %q (want v1 or v2)", c.Mode)
	}
	if err := chat.CheckPartitions(c.Partitions); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if c.Mode == ModeDualWrite && c.Partitions > 1 {
		return errors.New("serve: the v1 dual write has one lane: --partitions must be 1")
	}
	if c.BrokerURL != "" && !isNATS(c.BrokerURL) {
		return fmt.Errorf("serve: --broker-url %q: want nats://host:port or tls://host:port (\"\" for Redis Streams)", redactURL(c.BrokerURL))
	}
	return nil
}

// validateEndpoints checks the URLs and the TLS files, after the keys were
// read (a missing auth setting is reported first).
func (c *Config) validateEndpoints() error {
	switch {
	case c.DatabaseURL == "":
		return errors.New("serve: no database URL (--database-url or DATABASE_URL)")
	case c.needsRedis() && c.RedisURL == "":
		return errors.New("serve: no redis URL (--redis-url or REDIS_URL)")
	case c.has(RoleAPI) && (c.API.TLSCertFile == "") != (c.API.TLSKeyFile == ""):
		return errors.New("serve: give both --tls-cert and --tls-key, or neither")
	}
	return nil
}

// has reports whether the process runs role.
func (c *Config) has(role string) bool { return slices.Contains(c.Roles, role) }

// needsRedis reports whether a role of this process talks to Redis.
func (c *Config) needsRedis() bool { return len(c.redisRoles()) > 0 }

// redisRoles lists the roles of this process that need the queue (on
// Redis, or on NATS with BrokerURL) and with it Redis.
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

// directRelayWake reports whether sends wake this process's relay directly:
// in the after-commit mode with the API and relay roles in one process.
// The other modes are left to measure what they are (in-tx NOTIFY, poll
// only).
func (c *Config) directRelayWake() bool {
	return c.has(RoleAPI) && c.has(RoleRelay) && c.Mode == ModeOutbox &&
		c.API.Wake == outbox.WakeAfterCommit && !c.Relay.PollOnly
}

// listens reports whether the process needs the LISTEN connection: the
// gateway always does, the relay unless it polls only.
func (c *Config) listens() bool {
	return c.has(RoleAPI) || (c.has(RoleRelay) && c.Mode == ModeOutbox && !c.Relay.PollOnly)
}

// linger is the relays' outbox.RelayConfig.Linger: Linger, DefaultRelayLinger
// for 0, none for a negative one.
func (c RelayConfig) linger() time.Duration {
	switch {
	case c.Linger < 0:
		return 0
	case c.Linger == 0:
		return DefaultRelayLinger
	}
	return c.Linger
}
