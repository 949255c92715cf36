package env

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/auth"
	"github.com/outboxchat/outboxchat/chat/schema"
	"github.com/outboxchat/outboxchat/internal/devca"
	"github.com/outboxchat/outboxchat/internal/natsproc"
	"github.com/outboxchat/outboxchat/internal/pgbouncerproc"
	"github.com/outboxchat/outboxchat/internal/pgproc"
	"github.com/outboxchat/outboxchat/internal/redisproc"
	"github.com/outboxchat/outboxchat/internal/spawn"
	"github.com/outboxchat/outboxchat/lab/process"
	"github.com/outboxchat/outboxchat/natsq"
	"github.com/outboxchat/outboxchat/redisq"
)

// Variants of the send path and relay wake-up the lab can run.
const (
	VariantV1     = "v1"      // naive dual write from the API (--mode v1)
	VariantV2     = "v2"      // outbox, wake-up after commit (default)
	VariantV2Poll = "v2-poll" // outbox, relay polls only (--poll-only --wake none)
	VariantV2InTx = "v2-intx" // outbox, NOTIFY inside the send transaction (--wake in-tx)
)

// DefaultLockDuration is the lock duration the lab gives the workers (the
// write-up's test used 5 s; the services' default is 30 s).
const DefaultLockDuration = 5 * time.Second

// Process names in an Env (relay processes add "-relay", then "-2", "-3"…).
const (
	ProcConsumers = chat.Consumers
	ProcWorkers   = chat.Workers
)

// Options configures Start. The zero value is valid: v2, every role in
// one process per service, lock duration 5 s, temp dir.
type Options struct {
	// Variant is VariantV1, VariantV2 (default ""), VariantV2Poll or
	// VariantV2InTx.
	Variant string
	// ConsumersRelays and WorkersRelays are the number of separate relay
	// processes (`--role relay`) per service. 0 (default) runs the relay
	// role inside the service's main process. In v1 no relay runs.
	ConsumersRelays, WorkersRelays int
	// LockDuration is the workers' --lock-duration. Default
	// DefaultLockDuration (5 s).
	LockDuration time.Duration
	// ExtraArgs are appended to every serve command line.
	ExtraArgs []string
	// Faults maps a process name (e.g. "workers", "consumers-relay") to a
	// fault spec KIND:SEQ passed as --fault to that process's first start.
	Faults map[string]string
	// Dir holds the process logs. "" (default) makes a temp dir that Close
	// removes; a given Dir is kept, less the private files the lab wrote
	// there (the token secret, the event keys, the TLS server key): Close
	// removes those, as nothing needs them once the services are gone.
	Dir string
	// ConsumersAddr and WorkersAddr fix the services' HTTP addresses
	// ("127.0.0.1:PORT"). "" (default) picks free ports.
	ConsumersAddr, WorkersAddr string
	// Progress receives progress lines ("lab: …"). nil discards them.
	Progress io.Writer
	// Sentinel runs Redis as a Sentinel-managed pair: the primary (Redis),
	// one replica (RedisReplica) and three sentinels (Sentinels); the
	// services get a redis+sentinel:// URL (master SentinelMaster).
	Sentinel bool
	// APIs is the number of processes per service that run the api and
	// worker roles (each with its own HTTP port and consumer name
	// "<service>-N"). Default 1; the second and later are
	// Env.ConsumersAPIs and Env.WorkersAPIs.
	APIs int
	// Links, when set, routes each service's connections to Postgres and
	// to Redis through a proxy of its own (Links.Route), so that Inject
	// can degrade them with fault.Net faults (lab torture). The caller
	// closes it after the Env. Default nil: direct.
	Links *Links
	// Insecure runs the services without authentication
	// (--insecure-no-auth) and without signed stream entries: for
	// measuring what security costs. By default they check bearer tokens
	// signed with a secret the lab makes (Env.Token) and sign and check
	// every stream entry with event keys the lab makes.
	Insecure bool
	// PgBouncer puts a private PgBouncer (internal/pgbouncerproc, transaction
	// mode) between the services and Postgres, as on most managed
	// deployments: their --database-url goes through it with
	// default_query_exec_mode=exec, their --listen-database-url straight to
	// Postgres. Default false: direct.
	PgBouncer bool
	// TLS runs everything over TLS with a private CA (internal/devca) made
	// in Dir (Env.CAFile): Postgres (ssl = on; every URL the lab hands out
	// says sslmode=verify-full), Redis (TLS only; rediss:// URLs with
	// tls_ca_file), and the services' HTTP API and WebSocket (HTTPS, WSS;
	// Env.ConsumersURL is https://). Not with Sentinel. Default false.
	TLS bool
	// Durable runs the servers as production does: Postgres with fsync=on
	// and synchronous_commit=on, Redis with appendonly yes and appendfsync
	// everysec, so that every commit waits for the disk. Default false: the
	// fast mode, Postgres with fsync=off (synchronous_commit stays on, and
	// Redis is the same), whose data survive a crash of any process but not
	// of the machine; it leaves the disk's flush out of every figure.
	Durable bool
	// Debug gives every service process a pprof listener of its own
	// (serve --debug-addr on a free loopback port; Env.DebugAddrs), for
	// profiling under load. Default false: none.
	Debug bool
	// Partitions is every service process's --partitions (the Redis users'
	// ACLs cover every partition's keys). Default 0 or 1: one lane, no flag.
	Partitions int
	// PGSettings are extra Postgres server parameters ("name=value",
	// pgproc.Options.Settings), e.g. to preload pg_stat_statements for
	// counting statements. Default nil: none.
	PGSettings []string
	// RedisCluster runs Redis as a private Redis Cluster of
	// ClusterMasters masters with one replica each (Env.RedisCluster,
	// cluster-node-timeout ClusterNodeTimeout) instead of one server; the
	// services get a redis+cluster:// URL. Links then route Postgres only
	// (a cluster client follows the nodes' own addresses). Not with
	// Sentinel or TLS. Default false.
	RedisCluster bool
	// Broker is the queue between the services: BrokerRedis (default
	// ""), Redis Streams on the lab's Redis, or BrokerNATS, JetStream on
	// a private nats-server (Env.NATS; serve --broker-url), with Redis
	// kept for what is not the queue (the seq fence, presence, the live
	// hub). Links route Postgres and Redis only.
	Broker string
	// NATSCluster, with Broker BrokerNATS, runs a three-node JetStream
	// cluster (Env.NATSCluster, natsproc.StartCluster) instead of one
	// server, the streams with three replicas (serve --broker-replicas
	// 3). Default false: one server.
	NATSCluster bool
}

// Brokers the lab can run (Options.Broker).
const (
	BrokerRedis = "redis"
	BrokerNATS  = "nats"
)

// ServerMode names the servers' durability settings for output and logs:
// "durable: postgres fsync=on synchronous_commit=on, redis appendfsync
// everysec" with durable true, else the fast mode's "fast: postgres
// fsync=off synchronous_commit=on, redis appendfsync everysec".
func ServerMode(durable bool) string {
	if durable {
		return "durable: postgres fsync=on synchronous_commit=on, redis appendfsync everysec"
	}
	return "fast: postgres fsync=off synchronous_commit=on, redis appendfsync everysec"
}

// SentinelMaster is the master name of the lab's sentinels.
const SentinelMaster = "outboxchat"

// Env is a running lab environment: a private Postgres and Redis and both
// services as child processes. Close removes everything. Fields are set by
// Start and must not be changed; the Procs and servers are safe for
// concurrent use.
type Env struct {
	Postgres *pgproc.Server
	// PgBouncer is the pooler in front of Postgres (Options.PgBouncer),
	// nil without one.
	PgBouncer *pgbouncerproc.Server
	Redis     *redisproc.Server
	// RedisReplica and Sentinels are set with Options.Sentinel: the
	// primary's replica and the three sentinels watching them.
	RedisReplica *redisproc.Server
	Sentinels    []*redisproc.Server
	// RedisCluster is the cluster of Options.RedisCluster, nil without;
	// Redis is then its first node (a master at the start), RedisURL the
	// cluster's redis+cluster:// URL.
	RedisCluster *redisproc.Cluster
	// Consumers and Workers are the services' main processes (api and
	// worker roles, plus relay when no separate relay process runs).
	Consumers, Workers *process.Proc
	// ConsumersRelays and WorkersRelays are separate relay processes.
	ConsumersRelays, WorkersRelays []*process.Proc
	// ConsumersAPIs and WorkersAPIs are the further api,worker processes
	// of Options.APIs ("consumers-2", …), each with its own URL.
	ConsumersAPIs, WorkersAPIs []*process.Proc
	// ConsumersURL and WorkersURL are the services' HTTP base URLs
	// ("http://127.0.0.1:PORT"), fixed across restarts.
	ConsumersURL, WorkersURL string
	// DatabaseURL is the superuser URL of the lab database; RedisURL the
	// private Redis's URL.
	DatabaseURL, RedisURL string
	// Dir holds the process logs (<name>.log).
	Dir string
	// Variant is the variant the services run.
	Variant string
	// LockDuration is the workers' lock duration.
	LockDuration time.Duration
	// CAFile is the private CA's certificate (PEM) with Options.TLS:
	// clients trust it to reach the lab's servers (curl --cacert). "" without.
	CAFile string
	// Token is a development bearer token of user "lab" for every chat on
	// both services, valid for 30 days ("" when Insecure).
	Token string
	// PageTokens are the tokens `lab up` puts in each service's page URL,
	// by service: user PageUsers[service], every chat, both services, 30
	// days; nil when Insecure. Two named users, so that the pages show who
	// wrote what.
	PageTokens map[string]string
	// NATS is the private nats-server of Options.Broker BrokerNATS (its
	// JetStream store in Dir/nats), nil with Redis Streams or a cluster.
	NATS *natsproc.Server
	// NATSCluster is the three-node JetStream cluster of
	// Options.NATSCluster (stores in Dir/nats-cluster), nil without.
	NATSCluster *natsproc.Cluster
	// Broker echoes Options.Broker (BrokerRedis when it was "").
	Broker string
	// nc is the lab's own NATS connection (natsConn), made at first use.
	ncOnce sync.Once
	nc     *nats.Conn
	ncErr  error
	// Durable echoes Options.Durable: the servers flush every commit.
	Durable bool
	// Partitions is the services' --partitions (Options.Partitions, at
	// least 1).
	Partitions int
	// DebugAddrs maps each service process's name to its pprof address
	// ("127.0.0.1:PORT", /debug/pprof/) with Options.Debug; nil without.
	DebugAddrs map[string]string

	admin *pgxpool.Pool
	rdb   redis.UniversalClient
	links *Links // Options.Links
	// redisURLs are the services' own Redis URLs (least-privilege users).
	redisURLs map[string]string
	// dbURLs are the services' own database URLs, when routed.
	dbURLs map[string]string
	ownDir bool
	// secrets are the private files the lab wrote into Dir, which Close
	// removes when it keeps Dir.
	secrets []string
	closeMu sync.Mutex
	closed  bool
}

// VariantNames lists the variants, as an error naming a wrong one says.
const VariantNames = VariantV1 + ", " + VariantV2 + ", " + VariantV2Poll + " or " + VariantV2InTx

// CheckVariant returns an error naming v unless it is one of the variants.
func CheckVariant(v string) error {
	_, err := variantArgs(v)
	return err
}

// variantArgs returns the serve flags of a variant.
func variantArgs(v string) ([]string, error) {
	switch v {
	case VariantV1:
		// The write-up's v1 receiver shows what it gets as it gets it: no
		// hold behind a missing seq (its lost messages never come).
		return []string{"--mode", "v1", "--gap-timeout", "-1s"}, nil
	case VariantV2:
		return []string{"--mode", "v2", "--wake", "after-commit"}, nil
	case VariantV2Poll:
		return []string{"--mode", "v2", "--poll-only", "--wake", "none"}, nil
	case VariantV2InTx:
		return []string{"--mode", "v2", "--wake", "in-tx"}, nil
	}
	return nil, fmt.Errorf("lab: unknown variant %q (want %s)", v, VariantNames)
}

// UnlimitedArgs turn the services' per-IP and per-user rate limits and the
// WebSocket cap off (serve flags), for load the lab generates from one IP.
var UnlimitedArgs = []string{"--rate-ip=-1", "--rate-user=-1", "--ws-per-user=-1"}

// Start starts a private Postgres and Redis (appendonly yes), creates and
// migrates both services' roles and schemas, starts the service processes
// and waits until each is ready. On error everything started is removed.
// ctx bounds the start only; the Env lives until Close.
func Start(ctx context.Context, opts Options) (_ *Env, err error) {
	if opts.Variant == "" {
		opts.Variant = VariantV2
	}
	vargs, err := variantArgs(opts.Variant)
	if err != nil {
		return nil, err
	}
	if opts.LockDuration <= 0 {
		opts.LockDuration = DefaultLockDuration
	}
	if opts.ConsumersRelays < 0 || opts.WorkersRelays < 0 || opts.APIs < 0 {
		return nil, errors.New("lab: negative process count")
	}
	if opts.APIs == 0 {
		opts.APIs = 1
	}
	switch opts.Broker {
	case "", BrokerRedis:
		opts.Broker = BrokerRedis
	case BrokerNATS:
		if err := natsproc.Available(); err != nil {
			return nil, fmt.Errorf("lab: --broker nats: %w (scripts/install-deps.sh --test installs nats-server)", err)
		}
	default:
		return nil, fmt.Errorf("lab: unknown broker %q (want redis or nats)", opts.Broker)
	}
	progress := opts.Progress
	if progress == nil {
		progress = io.Discard
	}
	e := &Env{Dir: opts.Dir, Variant: opts.Variant, LockDuration: opts.LockDuration, Durable: opts.Durable, Partitions: max(opts.Partitions, 1),
		Broker: opts.Broker}
	if e.Dir == "" {
		// A lab killed with SIGKILL leaves its log dir behind: remove those
		// whose owner is gone, and mark ours the same way.
		spawn.ReapStale("outboxchat-lab-", slog.New(slog.NewTextHandler(io.Discard, nil)))
		if e.Dir, err = os.MkdirTemp("", "outboxchat-lab-"); err != nil {
			return nil, fmt.Errorf("lab: temp dir: %w", err)
		}
		e.ownDir = true
		if err := spawn.WriteOwner(e.Dir); err != nil {
			_ = os.RemoveAll(e.Dir)
			return nil, fmt.Errorf("lab: temp dir: %w", err)
		}
	} else if err := os.MkdirAll(e.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	defer func() {
		if err != nil {
			_ = e.Close()
		}
	}()

	pgOpts := pgproc.Options{Fsync: opts.Durable, Settings: opts.PGSettings}
	rdOpts := redisproc.Options{ACLFile: true}
	var certFile, keyFile string
	if opts.TLS {
		if opts.Sentinel {
			return nil, errors.New("lab: TLS with sentinels is not supported")
		}
		ca, err := devca.New()
		if err != nil {
			return nil, fmt.Errorf("lab: %w", err)
		}
		if e.CAFile, err = ca.WriteCA(e.Dir); err != nil {
			return nil, fmt.Errorf("lab: %w", err)
		}
		if certFile, keyFile, err = ca.Issue(e.Dir, "server", "127.0.0.1", "localhost", "::1"); err != nil {
			return nil, fmt.Errorf("lab: %w", err)
		}
		e.secrets = append(e.secrets, keyFile)
		pgOpts.TLSCertFile, pgOpts.TLSKeyFile = certFile, keyFile
		rdOpts.TLSCertFile, rdOpts.TLSKeyFile = certFile, keyFile
	}
	fmt.Fprintf(progress, "lab: starting private Postgres and Redis (%s)\n", ServerMode(opts.Durable))
	var wg sync.WaitGroup
	var pgErr, rdErr error
	wg.Add(2)
	go func() {
		defer wg.Done()
		e.Postgres, pgErr = pgproc.Start(ctx, &pgOpts)
	}()
	go func() {
		defer wg.Done()
		// An ACL file keeps the services' Redis users across the
		// experiments' Redis restarts.
		if opts.RedisCluster {
			rdErr = e.startCluster(ctx, opts, rdOpts, progress)
			return
		}
		e.Redis, rdErr = redisproc.Start(ctx, &rdOpts)
	}()
	wg.Wait()
	if err := errors.Join(pgErr, rdErr); err != nil {
		return nil, fmt.Errorf("lab: start servers: %w", err)
	}
	e.DatabaseURL = e.verifyFull(e.Postgres.AdminURL())
	e.RedisURL = e.withRedisCA(e.Redis.URL())
	if e.RedisCluster != nil {
		e.RedisURL = e.RedisCluster.URL()
	}
	if opts.PgBouncer {
		fmt.Fprintln(progress, "lab: starting private PgBouncer (transaction mode)")
		if e.PgBouncer, err = pgbouncerproc.Start(ctx, &pgbouncerproc.Options{
			Upstream: fmt.Sprintf("127.0.0.1:%d", e.Postgres.Port()), Mode: pgbouncerproc.ModeTransaction,
			Users: []string{"postgres", chat.Consumers, chat.Workers},
		}); err != nil {
			return nil, fmt.Errorf("lab: %w", err)
		}
	}
	if opts.Sentinel {
		if err := e.startSentinels(ctx, progress); err != nil {
			return nil, err
		}
	}
	if e.admin, err = pgxpool.New(ctx, e.DatabaseURL); err != nil {
		return nil, fmt.Errorf("lab: connect postgres: %w", err)
	}
	// Room for a blocking read per partition stream of each direction (the
	// torture's stream tap holds one each) besides the lab's own commands:
	// with the default pool (10 per core) 16 partitions' reads left the
	// drain check's XINFO calls waiting for a connection, 300 ms each.
	if e.rdb, err = redisq.NewClientPool(e.RedisURL, 2*max(opts.Partitions, 1)+10); err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	if err := e.redisUsers(ctx, max(opts.Partitions, 1)); err != nil {
		return nil, err
	}
	if opts.Links != nil {
		e.links = opts.Links
		if err := e.route(opts.Links.Route); err != nil {
			return nil, err
		}
	}
	for _, s := range []string{chat.Consumers, chat.Workers} {
		if err := schema.Bootstrap(ctx, e.admin, s); err != nil {
			return nil, fmt.Errorf("lab: %w", err)
		}
		if _, err := schema.Migrate(ctx, e.admin, s); err != nil {
			return nil, fmt.Errorf("lab: %w", err)
		}
	}

	switch {
	case opts.Broker == BrokerNATS && opts.NATSCluster:
		fmt.Fprintln(progress, "lab: starting a private JetStream cluster (3 nats-servers)")
		if e.NATSCluster, err = natsproc.StartCluster(ctx, 3, &natsproc.Options{Dir: filepath.Join(e.Dir, "nats-cluster")}); err != nil {
			return nil, fmt.Errorf("lab: %w", err)
		}
		vargs = append(slices.Clip(vargs), "--broker-url", e.NATSURL(), "--broker-replicas", "3")
	case opts.Broker == BrokerNATS:
		fmt.Fprintln(progress, "lab: starting private nats-server (JetStream)")
		if e.NATS, err = natsproc.Start(ctx, &natsproc.Options{Dir: filepath.Join(e.Dir, "nats")}); err != nil {
			return nil, fmt.Errorf("lab: %w", err)
		}
		vargs = append(slices.Clip(vargs), "--broker-url", e.NATSURL())
	case opts.NATSCluster:
		return nil, errors.New("lab: --nats-cluster needs --broker nats")
	}
	authArgs := []string{"--insecure-no-auth"}
	if !opts.Insecure {
		e.secrets = append(e.secrets, filepath.Join(e.Dir, jwtSecretFile), filepath.Join(e.Dir, eventKeysFile))
		if authArgs, e.Token, e.PageTokens, err = labSecrets(e.Dir); err != nil {
			return nil, err
		}
	}
	if opts.TLS {
		authArgs = append(authArgs, "--tls-cert", certFile, "--tls-key", keyFile)
	}
	if err := e.newProcs(opts, append(vargs, authArgs...)); err != nil {
		return nil, err
	}
	fmt.Fprintf(progress, "lab: starting %d service processes (%s)\n", len(e.Procs()), opts.Variant)
	if err := process.StartAll(ctx, e.Procs()...); err != nil {
		return nil, err
	}
	e.ConsumersURL, e.WorkersURL = e.Consumers.URL(), e.Workers.URL()
	return e, nil
}

// NATSURL is the services' --broker-url with Options.Broker BrokerNATS:
// the server's URL, or the cluster's seed list; "" with Redis Streams.
func (e *Env) NATSURL() string {
	switch {
	case e.NATSCluster != nil:
		return e.NATSCluster.URL()
	case e.NATS != nil:
		return e.NATS.URL()
	}
	return ""
}

// NATSConn is the lab's own connection to its NATS server or cluster
// (natsConn), for scenarios that look at the streams; closed by Close.
func (e *Env) NATSConn() (*nats.Conn, error) { return e.natsConn() }

// natsServers are the lab's nats-servers: the one, or the cluster's nodes.
func (e *Env) natsServers() []*natsproc.Server {
	switch {
	case e.NATSCluster != nil:
		return e.NATSCluster.Servers
	case e.NATS != nil:
		return []*natsproc.Server{e.NATS}
	}
	return nil
}

// natsConn is the lab's own connection to its nats-server, made at the
// first call (natsq.Connect: it reconnects across the experiments'
// restarts of the server); Close closes it.
func (e *Env) natsConn() (*nats.Conn, error) {
	e.ncOnce.Do(func() {
		e.nc, e.ncErr = natsq.Connect(e.NATSURL(), nats.Name("outboxchat-lab"), nats.RetryOnFailedConnect(true))
	})
	return e.nc, e.ncErr
}

// labTokenTTL is how long the lab's development token is valid.
const labTokenTTL = 30 * 24 * time.Hour

// PageUsers are the users of the pages `lab up` prints, by service.
var PageUsers = map[string]string{chat.Consumers: "alice", chat.Workers: "bob"}

// The files of labSecrets in the lab's dir.
const (
	jwtSecretFile = "jwt.secret"
	eventKeysFile = "event.keys"
)

// labSecrets writes fresh random secrets to dir (mode 0600): the HS256
// secret of bearer tokens (jwt.secret) and one event key per direction
// (event.keys). It returns the serve flags that use them, a token of user
// "lab" for every chat on both services, and one of each PageUsers user.
func labSecrets(dir string) (args []string, token string, pages map[string]string, err error) {
	random := func() (string, error) {
		b := make([]byte, 32)
		if _, err := rand.Read(b); err != nil {
			return "", fmt.Errorf("lab: secrets: %w", err)
		}
		return hex.EncodeToString(b), nil
	}
	secret, err := random()
	if err != nil {
		return nil, "", nil, err
	}
	keys := ""
	for _, s := range []string{chat.Consumers, chat.Workers} {
		k, err := random()
		if err != nil {
			return nil, "", nil, err
		}
		keys += chat.QueueName(s) + " " + k + "\n"
	}
	secretPath, keysPath := filepath.Join(dir, jwtSecretFile), filepath.Join(dir, eventKeysFile)
	if err := errors.Join(os.WriteFile(secretPath, []byte(secret), 0o600), os.WriteFile(keysPath, []byte(keys), 0o600)); err != nil {
		return nil, "", nil, fmt.Errorf("lab: secrets: %w", err)
	}
	token, err = auth.MintToken([]byte(secret), "lab", []string{chat.Consumers, chat.Workers}, auth.ChatScope{All: true}, labTokenTTL)
	if err != nil {
		return nil, "", nil, fmt.Errorf("lab: %w", err)
	}
	pages = map[string]string{}
	for svc, user := range PageUsers {
		if pages[svc], err = auth.MintToken([]byte(secret), user, []string{chat.Consumers, chat.Workers}, auth.ChatScope{All: true}, labTokenTTL); err != nil {
			return nil, "", nil, fmt.Errorf("lab: %w", err)
		}
	}
	return []string{"--jwt-secret-file", secretPath, "--event-key-file", keysPath}, token, pages, nil
}

// Procs returns every service process: consumers, its further API
// processes, its relays, then the same of workers.
func (e *Env) Procs() []*process.Proc {
	var out []*process.Proc
	for _, p := range append(append([]*process.Proc{e.Consumers}, e.ConsumersAPIs...), e.ConsumersRelays...) {
		if p != nil {
			out = append(out, p)
		}
	}
	for _, p := range append(append([]*process.Proc{e.Workers}, e.WorkersAPIs...), e.WorkersRelays...) {
		if p != nil {
			out = append(out, p)
		}
	}
	return out
}

// ServiceDatabaseURL returns the URL a service connects with: its own role
// (trust auth on the private server); with Options.TLS it says
// sslmode=verify-full against the lab's CA.
func (e *Env) ServiceDatabaseURL(service string) string {
	return e.verifyFull(fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", service, e.Postgres.Port(), pgproc.DefaultDatabase))
}

// verifyFull turns a private server URL's sslmode=disable into
// sslmode=verify-full against the lab's CA when the Env runs TLS.
func (e *Env) verifyFull(u string) string {
	if e.CAFile == "" {
		return u
	}
	return strings.Replace(u, "sslmode=disable", "sslmode=verify-full&sslrootcert="+url.QueryEscape(e.CAFile), 1)
}

// withRedisCA adds the lab CA (redisq.TLSCAFileParam) to a rediss:// URL.
func (e *Env) withRedisCA(u string) string {
	if e.CAFile == "" || !strings.HasPrefix(u, "rediss://") {
		return u
	}
	return u + "?" + redisq.TLSCAFileParam + "=" + url.QueryEscape(e.CAFile)
}

// serveDatabaseURL is the --database-url of service's processes: through
// the PgBouncer when the Env has one, else ServiceDatabaseURL.
func (e *Env) serveDatabaseURL(service string) string {
	if e.PgBouncer != nil {
		return e.PgBouncer.Rewrite(e.ServiceDatabaseURL(service)) + "&default_query_exec_mode=exec"
	}
	return e.ServiceDatabaseURL(service)
}

// redisUsers makes each service's least-privilege Redis user
// (schema.RedisACLPartitions, for partitions per direction) with a random
// password, saved in the server's ACL file.
func (e *Env) redisUsers(ctx context.Context, partitions int) error {
	e.redisURLs = map[string]string{}
	for _, s := range []string{chat.Consumers, chat.Workers} {
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			return fmt.Errorf("lab: redis password: %w", err)
		}
		pw := hex.EncodeToString(b)
		args, err := schema.RedisACLPartitions(s, RedisPrefix, s, pw, partitions)
		if err != nil {
			return fmt.Errorf("lab: %w", err)
		}
		if e.RedisCluster != nil {
			if err := e.clusterUser(ctx, args); err != nil {
				return err
			}
			e.redisURLs[s] = strings.Replace(e.RedisURL, "://", "://"+s+":"+pw+"@", 1)
			continue
		}
		if err := schema.ApplyRedisACL(ctx, e.rdb, args); err != nil {
			return fmt.Errorf("lab: %w", err)
		}
		e.redisURLs[s] = e.withRedisCA(strings.Replace(e.Redis.URL(), "://", "://"+s+":"+pw+"@", 1))
		if e.RedisReplica != nil {
			// ACL users are not replicated: the replica that a failover
			// promotes needs them too. The services find the primary
			// through the sentinels.
			rc := redis.NewClient(&redis.Options{Addr: e.RedisReplica.Addr()})
			err := schema.ApplyRedisACL(ctx, rc, args)
			rc.Close()
			if err != nil {
				return fmt.Errorf("lab: redis user on the replica: %w", err)
			}
			e.redisURLs[s] = redisq.SentinelScheme + "://" + s + ":" + pw + "@" + strings.TrimPrefix(e.RedisURL, redisq.SentinelScheme+"://")
		}
	}
	return nil
}

// route points each service's database and Redis URL at the address
// route gives for it.
func (e *Env) route(route func(service, server, addr string) (string, error)) error {
	e.dbURLs = map[string]string{}
	for _, s := range []string{chat.Consumers, chat.Workers} {
		pg, err := route(s, "postgres", net.JoinHostPort("127.0.0.1", strconv.Itoa(e.Postgres.Port())))
		if err != nil {
			return fmt.Errorf("lab: route %s to postgres: %w", s, err)
		}
		e.dbURLs[s] = fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", s, pg, pgproc.DefaultDatabase)
		if e.RedisCluster != nil {
			continue
		}
		rd, err := route(s, "redis", e.Redis.Addr())
		if err != nil {
			return fmt.Errorf("lab: route %s to redis: %w", s, err)
		}
		e.redisURLs[s] = strings.Replace(e.redisURLs[s], "@"+e.Redis.Addr()+"/", "@"+rd+"/", 1)
	}
	return nil
}

// ServiceRedisURL returns the URL a service connects to Redis with: its own
// least-privilege user (schema.RedisACL). RedisURL is the administrator's.
func (e *Env) ServiceRedisURL(service string) string { return e.redisURLs[service] }

// Admin returns a superuser pool on the lab database (owned by the Env).
func (e *Env) Admin() *pgxpool.Pool { return e.admin }

// RedisClient returns a Redis client on the private Redis (owned by the
// Env; fail-fast settings of redisq.NewClient).
func (e *Env) RedisClient() redis.UniversalClient { return e.rdb }

// Close kills every process, closes the connections, stops and removes the
// private servers and the temp dir; of a given Options.Dir it removes the
// lab's private files only. It is idempotent and returns the first error.
func (e *Env) Close() error {
	e.closeMu.Lock()
	defer e.closeMu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	var errs []error
	for _, p := range e.Procs() {
		errs = append(errs, p.Close())
	}
	if e.admin != nil {
		e.admin.Close()
	}
	if e.rdb != nil {
		errs = append(errs, e.rdb.Close())
	}
	for _, sn := range e.Sentinels {
		errs = append(errs, sn.Close())
	}
	if e.RedisReplica != nil {
		errs = append(errs, e.RedisReplica.Close())
	}
	if e.RedisCluster != nil {
		errs = append(errs, e.RedisCluster.Close())
	}
	if e.nc != nil {
		e.nc.Close()
	}
	if e.NATS != nil {
		errs = append(errs, e.NATS.Close())
	}
	if e.NATSCluster != nil {
		errs = append(errs, e.NATSCluster.Close())
	}
	if e.Redis != nil {
		errs = append(errs, e.Redis.Close())
	}
	if e.PgBouncer != nil {
		errs = append(errs, e.PgBouncer.Close())
	}
	if e.Postgres != nil {
		errs = append(errs, e.Postgres.Close())
	}
	if e.ownDir {
		errs = append(errs, os.RemoveAll(e.Dir))
	} else {
		for _, f := range e.secrets {
			if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// startSentinels starts the replica of e.Redis, waits until it is in sync,
// starts three sentinels and sets e.RedisURL to the redis+sentinel:// URL.
func (e *Env) startSentinels(ctx context.Context, progress io.Writer) error {
	fmt.Fprintln(progress, "lab: starting a Redis replica and three sentinels")
	var err error
	if e.RedisReplica, err = redisproc.Start(ctx, &redisproc.Options{ReplicaOf: e.Redis.Addr()}); err != nil {
		return fmt.Errorf("lab: start redis replica: %w", err)
	}
	rc := redis.NewClient(&redis.Options{Addr: e.RedisReplica.Addr()})
	defer rc.Close()
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := WaitFor(wctx, 50*time.Millisecond, func() bool {
		info, err := rc.Info(wctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	}); err != nil {
		return errors.New("lab: the redis replica did not sync with the primary")
	}
	var addrs []string
	for range 3 {
		sn, err := redisproc.Start(ctx, &redisproc.Options{Sentinel: &redisproc.SentinelOptions{
			MasterName: SentinelMaster, MasterAddr: e.Redis.Addr(), Quorum: 2,
			DownAfter: time.Second, FailoverTimeout: 5 * time.Second,
		}})
		if err != nil {
			return fmt.Errorf("lab: start sentinel: %w", err)
		}
		e.Sentinels = append(e.Sentinels, sn)
		addrs = append(addrs, sn.Addr())
	}
	// Every sentinel must know the replica and the others before a
	// failover can elect a leader and promote it.
	if err := WaitFor(wctx, 100*time.Millisecond, func() bool {
		for _, sn := range e.Sentinels {
			c := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr()})
			m, err := c.Master(wctx, SentinelMaster).Result()
			c.Close()
			if err != nil || m["num-slaves"] != "1" || m["num-other-sentinels"] != "2" {
				return false
			}
		}
		return true
	}); err != nil {
		return errors.New("lab: the sentinels did not discover the replica and each other")
	}
	e.RedisURL = redisq.SentinelScheme + "://" + strings.Join(addrs, ",") + "/" + SentinelMaster + "/0"
	return nil
}

// SentinelPrimary returns the primary's address as the first sentinel
// reports it.
func (e *Env) SentinelPrimary(ctx context.Context) (string, error) {
	if len(e.Sentinels) == 0 {
		return "", errors.New("lab: no sentinels")
	}
	c := redis.NewSentinelClient(&redis.Options{Addr: e.Sentinels[0].Addr()})
	defer c.Close()
	a, err := c.GetMasterAddrByName(ctx, SentinelMaster).Result()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(a[0], a[1]), nil
}

// newProcs makes (stopped) the service processes of opts: per service its
// main process, the further API processes and the relays, each running
// serve with serveArgs (the variant's and the auth flags) after its own.
func (e *Env) newProcs(opts Options, serveArgs []string) error {
	fixedAddr := map[string]string{chat.Consumers: opts.ConsumersAddr, chat.Workers: opts.WorkersAddr}
	newProc := func(service, name, roles string, api bool, consumer string) (*process.Proc, error) {
		args := []string{"--service", service, "--role", roles,
			"--lock-duration", opts.LockDuration.String(), "--consumer-name", consumer}
		// The URLs carry the service roles' passwords: they go in the
		// environment serve reads them from (readable by the lab's user
		// only), not on the command line, which every user's ps shows.
		urls := []string{"DATABASE_URL=" + e.serveDatabaseURL(service), "REDIS_URL=" + e.ServiceRedisURL(service)}
		if e.PgBouncer != nil {
			urls = append(urls, "LISTEN_DATABASE_URL="+e.ServiceDatabaseURL(service))
		}
		if opts.Partitions > 1 {
			args = append(args, "--partitions", strconv.Itoa(opts.Partitions))
		}
		args = append(args, serveArgs...)
		args = append(args, opts.ExtraArgs...)
		if f := opts.Faults[name]; f != "" {
			args = append(args, "--fault", f)
		}
		if opts.Debug {
			a, err := spawn.FreeAddr()
			if err != nil {
				return nil, fmt.Errorf("lab: %s: pick a debug port: %w", name, err)
			}
			if e.DebugAddrs == nil {
				e.DebugAddrs = map[string]string{}
			}
			e.DebugAddrs[name] = a
			args = append(args, "--debug-addr", a)
		}
		cfg := &process.Config{Args: args, Env: urls, API: api, LogPath: filepath.Join(e.Dir, name+".log"), TLS: opts.TLS}
		if api && consumer == service+"-1" {
			cfg.Addr = fixedAddr[service]
		}
		if !api {
			cfg.ReadyMsg = "relay started"
		}
		return process.New(name, cfg)
	}
	relayNames := func(service string, n int) []string {
		var out []string
		for i := 1; i <= n; i++ {
			name := service + "-relay"
			if i > 1 {
				name += "-" + strconv.Itoa(i)
			}
			out = append(out, name)
		}
		return out
	}
	for _, s := range []struct {
		service string
		relays  int
		main    **process.Proc
		rel     *[]*process.Proc
		apis    *[]*process.Proc
	}{
		{chat.Consumers, opts.ConsumersRelays, &e.Consumers, &e.ConsumersRelays, &e.ConsumersAPIs},
		{chat.Workers, opts.WorkersRelays, &e.Workers, &e.WorkersRelays, &e.WorkersAPIs},
	} {
		roles := "api,worker,relay"
		if s.relays > 0 || opts.Variant == VariantV1 {
			roles = "api,worker"
		}
		var err error
		if *s.main, err = newProc(s.service, s.service, roles, true, s.service+"-1"); err != nil {
			return err
		}
		for i := 2; i <= opts.APIs; i++ {
			name := s.service + "-" + strconv.Itoa(i)
			p, err := newProc(s.service, name, roles, true, name)
			if err != nil {
				return err
			}
			*s.apis = append(*s.apis, p)
		}
		if opts.Variant == VariantV1 {
			continue
		}
		for _, name := range relayNames(s.service, s.relays) {
			p, err := newProc(s.service, name, "relay", false, s.service+"-1")
			if err != nil {
				return err
			}
			*s.rel = append(*s.rel, p)
		}
	}
	return nil
}
