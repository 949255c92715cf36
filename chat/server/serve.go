package server

import (
	"github.com/outboxchat/outboxchat/chat/telemetry"

	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/auth"
	"github.com/outboxchat/outboxchat/chat/gateway"
	"github.com/outboxchat/outboxchat/chat/lease"
	"github.com/outboxchat/outboxchat/chat/presence"
	"github.com/outboxchat/outboxchat/chat/schema"
	"github.com/outboxchat/outboxchat/chat/server/internal/consumername"
	"github.com/outboxchat/outboxchat/chat/server/internal/metrics"
	"github.com/outboxchat/outboxchat/chat/store"
	"github.com/outboxchat/outboxchat/internal/notifier"
	"github.com/outboxchat/outboxchat/internal/service"
	"github.com/outboxchat/outboxchat/outbox"
	"github.com/outboxchat/outboxchat/redisq"
)

// stopTimeout bounds Serve's graceful stop of all its services.
const stopTimeout = 15 * time.Second

// Serve runs one service process until ctx is done, then stops gracefully.
// cfg goes through Config.WithDefaults; migrations are applied at start.
// The stop, in order (docs/OPERATING.md, "Graceful shutdown"):
//
//  1. /readyz answers 503 {"status": "stopping"}; the API keeps serving for
//     APIConfig.ShutdownDelay (default 0).
//  2. The listener closes; HTTP requests in flight finish: each send
//     answers 201 with its row committed, or an error with no row.
//  3. Every WebSocket is closed with 1001 (going away), so clients
//     reconnect, elsewhere, with their cursors.
//  4. The other services stop in the reverse of their start
//     (internal/service; steps 1–4 within stopTimeout, 15 s, in all): the
//     send path's group committer, the gateway, the relay (it finishes
//     its pass: published rows are deleted), the worker (it finishes its
//     batch, commits and acks it; a batch still failing is left pending
//     for the queue to hand out again), the LISTEN connection.
//
// It returns nil after a stop caused by ctx, or the error that kept it
// from starting (a bad setting fails before anything runs).
func Serve(ctx context.Context, cfg Config) error {
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		return err
	}
	log := c.Logger.With("service", c.Service)
	p := &process{cfg: c, log: log, reg: prometheus.NewRegistry(), tracer: telemetry.New(c.TracerProvider)}
	if c.gatherer != nil {
		c.gatherer(p.reg)
	}
	if err := p.loadKeys(); err != nil {
		return err
	}
	if err := c.validateEndpoints(); err != nil {
		return err
	}
	if p.cfg.needsRedis() {
		var err error
		if p.rdb, err = p.connectRedis(ctx); err != nil {
			return err
		}
		defer p.rdb.Close()
	}
	if c.BrokerURL != "" && len(c.redisRoles()) > 0 {
		if err := p.connectNATS(); err != nil {
			return err
		}
		defer p.nc.Close()
	}
	pool, err := p.connectPostgres(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := p.claimConsumerName(ctx); err != nil {
		return err
	}
	p.m = metrics.New(p.reg, metrics.Parts{Service: c.Service, RedisPrefix: c.RedisPrefix, Listens: c.listens(),
		Relay: c.has(RoleRelay), Worker: c.has(RoleWorker), NATS: p.nc}, pool, p.rdb)
	if err := p.build(); err != nil {
		return err
	}
	if p.http != nil {
		defer p.http.ln.Close() // when a service fails to start, the server never served it
	}
	svcs := p.services
	if c.kill != nil {
		svcs = killable(svcs, c.kill)
	}
	return runServices(ctx, log, svcs, p.up)
}

// killable wraps svcs so that closing kill cancels their Start contexts
// (a hard stop of each, as a killed process's).
func killable(svcs []service.Service, kill <-chan struct{}) []service.Service {
	out := make([]service.Service, len(svcs))
	for i, s := range svcs {
		out[i] = killableService{Service: s, kill: kill}
	}
	return out
}

type killableService struct {
	service.Service
	kill <-chan struct{}
}

func (k killableService) Start(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		<-k.kill
		cancel()
	}()
	return k.Service.Start(ctx)
}

// process is what Serve builds for one process: its connections, metrics
// and services, in start order. Everything is built before anything
// starts.
type process struct {
	cfg  *Config
	log  *slog.Logger
	pool *pgxpool.Pool
	rdb  redis.UniversalClient
	// nc is the NATS connection when the queue is on JetStream
	// (Config.BrokerURL; nil otherwise).
	nc   *nats.Conn
	reg  *prometheus.Registry
	m    *metrics.Set
	keys *auth.EventKeys
	// fence keeps seqs from going backwards across a failover (store.Fence).
	fence *store.Fence
	// tracer records the spans (Config.TracerProvider); off when nil.
	tracer *telemetry.Tracer
	// verifier checks the API's bearer tokens; nil when auth is off.
	verifier *auth.Verifier
	// own holds the backend pids of this process's pool (uint32 →
	// struct{}), so the notifier can tell its own notifications from other
	// processes'. (Through a pooler they are the pooler's, so none
	// matches: own notifications then cost the gateway and relay one
	// redundant read each.)
	own      sync.Map
	listener *notifier.Notifier
	// presence keeps the consumer name live (the worker role; nil
	// without it).
	presence *consumername.Keeper
	gw       *gateway.Gateway
	// relayWake wakes this process's relay of a partition (nil without
	// the relay role or when it polls only); relayWakeChats those of the
	// chats of a send batch. Set while building, read after the start.
	relayWake      func(partition int) (running bool)
	relayWakeChats func(ms []chat.Message)
	// leases runs the relays of the partitions this process holds (nil
	// with one partition or without the relay role).
	leases   *lease.Manager
	http     *httpService
	services []service.Service
	// announce are log lines saying a role started (the lab waits for
	// "relay started"), written once every service has.
	announce []func()
}

func (p *process) add(svcs ...service.Service) { p.services = append(p.services, svcs...) }

// build builds the services of the process's roles in start order
// (runServices stops them in reverse): notifier, inbox consumer, relay
// (heartbeat, vacuum, re-drive), then the API's writer, gateway, store,
// dual writer and HTTP server.
func (p *process) build() error {
	c := p.cfg
	if p.presence != nil {
		// Before the worker, so the name stays live until it has acked.
		p.add(p.presence)
		p.m.ConsumerNameShared(p.presence.Shared)
	}
	if c.listens() {
		if err := p.buildListener(); err != nil {
			return err
		}
	}
	// The gateway exists before the worker, which hands it every inbox
	// commit (OfferApplied); it starts with the API.
	if c.has(RoleAPI) {
		if err := p.buildGateway(); err != nil {
			return err
		}
	}
	if c.has(RoleWorker) {
		if err := p.buildWorker(); err != nil {
			return err
		}
	}
	if c.has(RoleRelay) && c.Mode == ModeOutbox {
		if err := p.buildRelay(); err != nil {
			return err
		}
	}
	if c.has(RoleAPI) {
		return p.buildAPI()
	}
	return nil
}

// up runs once every service has started.
func (p *process) up() {
	for _, f := range p.announce {
		f()
	}
	if p.http != nil {
		p.http.announce(p.cfg)
	}
}

// loadKeys reads the event keys and the API's token keys, and warns when
// the stream goes unsigned or the API unauthenticated.
func (p *process) loadKeys() error {
	c := p.cfg
	if c.EventKeyFile != "" {
		keys, err := auth.ReadEventKeys(c.EventKeyFile)
		if err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		p.keys = keys
	} else if c.has(RoleWorker) || c.has(RoleRelay) {
		p.log.Warn("stream entries are not signed (no --event-key-file): anyone who can write to Redis can forge messages")
	}
	if c.has(RoleAPI) {
		v, err := auth.NewVerifier(c.Service, c.API.Auth)
		if err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		if v == nil {
			p.log.Warn("AUTHENTICATION IS OFF (--insecure-no-auth): anyone who can reach " + c.API.HTTPAddr +
				" can read and write every chat; use this only on a closed network")
		}
		p.verifier = v
	}
	return nil
}

// connectPostgres opens the pool, checks for a transaction-mode pooler and
// applies the migrations.
func (p *process) connectPostgres(ctx context.Context) (*pgxpool.Pool, error) {
	c := p.cfg
	pcfg, err := schema.PoolConfigPartitions(c.DatabaseURL, c.Partitions)
	if err != nil {
		return nil, err
	}
	// plan_cache_mode per session, not as a startup parameter, which
	// poolers refuse (schema.PlanCacheSetup).
	setPlan := schema.PlanCacheSetup(pcfg)
	var rdb redis.UniversalClient
	if p.rdb != nil {
		rdb = p.rdb
	}
	if p.fence, err = store.NewFence(rdb, c.RedisPrefix, c.Service, p.log); err != nil {
		return nil, err
	}
	pcfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		p.own.Store(conn.PgConn().PID(), struct{}{})
		if setPlan != "" {
			if _, err := conn.Exec(ctx, setPlan); err != nil {
				return fmt.Errorf("set plan_cache_mode: %w", err)
			}
		}
		// Every new connection (a new primary after a failover among
		// them) is checked before it is used for a send.
		return p.fence.Check(ctx, conn)
	}
	pcfg.BeforeClose = func(conn *pgx.Conn) { p.own.Delete(conn.PgConn().PID()) }
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("serve: connect postgres: %w", err)
	}
	p.log.Info("database pool", "max_conns", pcfg.MaxConns, "min_conns", pcfg.MinConns)
	if err := schema.CheckPooler(ctx, pool, p.log); err != nil {
		pool.Close()
		return nil, fmt.Errorf("serve: %w", err)
	}
	if n, err := schema.Migrate(ctx, pool, c.Service); err != nil {
		pool.Close()
		return nil, fmt.Errorf("serve: %w", err)
	} else if n > 0 {
		p.log.Info("migrations applied", "count", n)
	}
	if err := schema.EnsurePartitions(ctx, pool, c.Service, c.Partitions); err != nil {
		pool.Close()
		return nil, fmt.Errorf("serve: %w", err)
	}
	// The fence's writers enqueue in-transaction wake-ups: a fence is rare,
	// and it must not depend on a writer that only the api role starts.
	fws := make([]*outbox.Writer, c.Partitions)
	for part := range fws {
		if fws[part], err = outbox.NewWriter(pool, &outbox.WriterConfig{
			Table: chat.OutboxTable(c.Service, part), Channel: chat.PartitionOutboxChannel(c.Service, part),
			Mode: outbox.WakeInTx, Logger: p.log,
		}); err != nil {
			pool.Close()
			return nil, err
		}
	}
	p.fence.SetWriter(fws...)
	// The connections opened before the migrations skipped the check.
	// A process without Redis waits for one with it to fence a new
	// incarnation: its sends fail until then, its start does not.
	err = pool.AcquireFunc(ctx, func(pc *pgxpool.Conn) error { return p.fence.Check(ctx, pc.Conn()) })
	if errors.Is(err, store.ErrNotFenced) {
		p.log.Warn("sends wait until a relay or worker process fences the database", "err", err)
	} else if err != nil {
		pool.Close()
		return nil, fmt.Errorf("serve: %w", err)
	}
	p.pool = pool
	return pool, nil
}

// connectRedis opens the Redis client and logs whether Redis is durable.
func (p *process) connectRedis(ctx context.Context) (redis.UniversalClient, error) {
	// With partitions, the worker blocks in one read per partition's
	// stream: room for those besides the pool's usual size.
	pool := 0
	if n := p.cfg.Partitions; n > 1 {
		pool = 10*runtime.GOMAXPROCS(0) + 2*n
	}
	rdb, err := redisq.NewClientPool(p.cfg.RedisURL, pool)
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := redisq.CheckDurability(cctx, rdb, p.log); err != nil && !errors.Is(err, redisq.ErrNotDurable) {
		p.log.Warn("could not check redis durability (redis down?); continuing", "err", err)
	}
	if acks := p.cfg.RedisReplicaAcks; acks > 0 {
		// A master with fewer replicas in sync takes no add until it has
		// them: its rows wait in the outbox. Say so at once.
		counts, err := redisq.ReplicasInSync(cctx, rdb)
		for addr, n := range counts {
			if n < acks {
				p.log.Warn("REDIS MASTER HAS TOO FEW REPLICAS IN SYNC for --redis-replica-acks: adds to it wait until it has them",
					"node", addr, "replicas_in_sync", n, "replica_acks", acks)
			}
		}
		if err != nil {
			p.log.Warn("could not count redis replicas (redis down?); continuing", "err", err)
		}
	}
	return rdb, nil
}

// claimConsumerName settles the process's consumer name (Worker.ConsumerName):
// with the worker role the explicit one, or one claimed unique, and its
// presence; without it (the name only names the relay's heartbeat row)
// the explicit one or "<service>-<hostname>-relay".
func (p *process) claimConsumerName(ctx context.Context) error {
	c := p.cfg
	if !c.has(RoleWorker) {
		if c.Worker.ConsumerName == "" {
			host, _ := os.Hostname()
			c.Worker.ConsumerName = c.Service + "-" + host + "-relay"
		}
		return nil
	}
	pr, err := presence.New(p.rdb, c.RedisPrefix, chat.QueueName(chat.Peer(c.Service)), c.Service, 0)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	c.Worker.ConsumerName = consumername.Claim(ctx, pr, c.Service, c.Worker.ConsumerName, p.log)
	p.presence = consumername.NewKeeper(pr, c.Worker.ConsumerName, c.LockDuration, p.log)
	p.log.Info("consumer name", "consumer", c.Worker.ConsumerName, "instance", pr.Instance())
	return nil
}

// buildListener builds the process's one LISTEN connection: the relay and
// the gateway subscribe to it by channel. Started first, stopped last.
func (p *process) buildListener() error {
	c := p.cfg
	lcc, err := schema.ListenConnConfig(c.ListenDatabaseURL, p.pool)
	if err != nil {
		return err
	}
	p.listener, err = notifier.New(&notifier.Config{
		ConnConfig: lcc, Logger: p.log,
		Own:          func(pid uint32) bool { _, own := p.own.Load(pid); return own },
		SelfCheckFix: "set --listen-database-url (LISTEN_DATABASE_URL) to a direct or session-mode URL of the same database",
		OnSelfCheck: func(ok bool) {
			p.m.SelfCheck(ok)
			if c.onSelfCheck != nil {
				c.onSelfCheck(ok)
			}
		},
	})
	if err != nil {
		return err
	}
	p.m.ListenReconnects(p.listener.Reconnects)
	p.add(p.listener)
	return nil
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
