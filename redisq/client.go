package redisq

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	neturl "net/url"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Timeouts of the client returned by NewClient.
const (
	// ClientDialTimeout bounds establishing one connection.
	ClientDialTimeout = 500 * time.Millisecond
	// ClientReadTimeout bounds waiting for one reply (blocking commands such
	// as XREADGROUP BLOCK get their block time added by go-redis).
	ClientReadTimeout = time.Second
	// ClientWriteTimeout bounds writing one command.
	ClientWriteTimeout = time.Second
	// ClientPoolTimeout bounds waiting for a free pooled connection.
	ClientPoolTimeout = time.Second
)

// NewClient returns a fail-fast Redis client for url: a *redis.Client for
// "redis://[user:password@]host:port[/db]" (also "rediss://" and "unix://"),
// a *redis.Client through Sentinel for "redis+sentinel://", a
// *redis.ClusterClient for "redis+cluster://" and "rediss+cluster://".
//
// The client never retries a command (MaxRetries -1) and dials once per
// attempt (no dial retries); dial timeout ClientDialTimeout, read and write
// timeouts ClientReadTimeout and ClientWriteTimeout, pool timeout
// ClientPoolTimeout, and it honours ctx deadlines (ContextTimeoutEnabled). It
// sends no CLIENT SETINFO and no maintenance-notification handshake.
//
// go-redis has no offline queue: a command issued while Redis is unreachable
// fails at once (after at most the dial timeout) and is not kept in memory
// for later. The outbox relay relies on that: it holds nothing in memory, so
// on error its transaction rolls back and the rows stay unsent for its next
// pass; a client that buffered commands would add jobs behind its back.
//
// url's query parameters (e.g. "?dial_timeout=2s") are applied first and then
// overridden by the settings above. One parameter is ours, not go-redis's:
// "rediss://host:port/0?tls_ca_file=/path/ca.pem" verifies the server's
// certificate against the CA certificates (PEM) in that file instead of
// the system's roots (a private CA; the host name is still checked). The
// caller owns the client and must Close it. Errors: a malformed url, an
// unreadable or empty tls_ca_file, tls_ca_file without rediss:// (or
// rediss+cluster://).
//
// A "redis+sentinel://" url (see ParseSentinelURL) returns go-redis's
// failover client instead, with the same fail-fast settings: it asks the
// sentinels for the primary of the named master and follows failovers;
// every command (CheckDurability's CONFIG GET too) goes to the primary.
//
// A "redis+cluster://" url (see ParseClusterURL) returns go-redis's cluster
// client with the same settings on every node's connections. Within one
// call it follows MOVED and ASK redirections and retries TRYAGAIN (a
// multi-key command during a slot migration) and connection failures, at
// most ClusterMaxRedirects times in all, waiting ClusterMinRetryBackoff to
// ClusterMaxRetryBackoff between retries; nothing is kept across calls.
// A CLUSTERDOWN reply to a single command is returned at once, not
// retried, as a *ClusterDownError (matching ErrClusterDown); a pipeline
// whose first command meets CLUSTERDOWN is resent by go-redis within the
// same bound. go-redis also resends a command after a lost reply (EOF, a
// read timeout) within that bound: an add is idempotent, a re-add counts a
// job its call added already and adds it once, and a dead-lettering or a
// replay resent may leave a second dead-letter entry or report nothing
// replayed for an entry it did replay.
func NewClient(url string) (redis.UniversalClient, error) {
	return NewClientPool(url, 0)
}

// NewClientPool is NewClient with room for at least poolSize connections
// per node (go-redis's PoolSize, whose default is 10 per GOMAXPROCS): a
// process that blocks in one XREADGROUP per stream (a consumer per
// partition) holds a connection for each while its other commands need
// theirs. A pool_size in url counts if it is larger. poolSize ≤ 0: as
// NewClient.
func NewClientPool(url string, poolSize int) (redis.UniversalClient, error) {
	grow := func(size *int) {
		if poolSize > 0 {
			*size = max(cmp.Or(*size, 10*runtime.GOMAXPROCS(0)), poolSize)
		}
	}
	if strings.HasPrefix(url, SentinelScheme+"://") {
		fo, err := ParseSentinelURL(url)
		if err != nil {
			return nil, err
		}
		failFast(&fo.MaxRetries, &fo.DialerRetries, &fo.DialTimeout, &fo.ReadTimeout, &fo.WriteTimeout,
			&fo.PoolTimeout, &fo.ContextTimeoutEnabled, &fo.DisableIdentity)
		grow(&fo.PoolSize)
		return redis.NewFailoverClient(fo), nil
	}
	if strings.HasPrefix(url, ClusterScheme+"://") || strings.HasPrefix(url, ClusterTLSScheme+"://") {
		return newClusterClient(url, grow)
	}
	url, caFile, err := cutQueryParam(url, TLSCAFileParam)
	if err != nil {
		return nil, fmt.Errorf("redisq: parsing redis url: %w", err)
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("redisq: parsing redis url: %w", err)
	}
	if err := setCAFile(opt.TLSConfig, caFile); err != nil {
		return nil, err
	}
	failFast(&opt.MaxRetries, &opt.DialerRetries, &opt.DialTimeout, &opt.ReadTimeout, &opt.WriteTimeout,
		&opt.PoolTimeout, &opt.ContextTimeoutEnabled, &opt.DisableIdentity)
	grow(&opt.PoolSize)
	opt.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	return redis.NewClient(opt), nil
}

// setCAFile makes cfg (a rediss:// client's TLS config, nil without TLS)
// trust only the CA certificates in caFile; "" leaves cfg alone.
func setCAFile(cfg *tls.Config, caFile string) error {
	if caFile == "" {
		return nil
	}
	if cfg == nil {
		return fmt.Errorf("redisq: %s needs a rediss:// url", TLSCAFileParam)
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return fmt.Errorf("redisq: %s: %w", TLSCAFileParam, err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return fmt.Errorf("redisq: %s %s: no PEM certificate in it", TLSCAFileParam, caFile)
	}
	cfg.RootCAs = roots
	return nil
}

// failFast sets NewClient's fail-fast settings on the fields of either
// option type (redis.Options, redis.FailoverOptions), which share the
// fields but no type: no retries, one dial attempt, the Client* timeouts,
// context deadlines honoured, no CLIENT SETINFO.
func failFast(maxRetries, dialerRetries *int, dial, read, write, pool *time.Duration, ctxTimeout, noIdentity *bool) {
	*maxRetries, *dialerRetries = -1, 1
	*dial, *read, *write, *pool = ClientDialTimeout, ClientReadTimeout, ClientWriteTimeout, ClientPoolTimeout
	*ctxTimeout, *noIdentity = true, true
}

// TLSCAFileParam is NewClient's URL parameter naming a file of CA
// certificates (PEM) that a rediss:// server's certificate must chain to.
const TLSCAFileParam = "tls_ca_file"

// cutQueryParam returns rawURL without its query parameter name, and the
// parameter's value ("" when absent).
func cutQueryParam(rawURL, name string) (string, string, error) {
	u, err := neturl.Parse(rawURL)
	if err != nil {
		return "", "", err
	}
	q := u.Query()
	if !q.Has(name) {
		return rawURL, "", nil
	}
	v := q.Get(name)
	q.Del(name)
	u.RawQuery = q.Encode()
	return u.String(), v, nil
}

// SentinelScheme is the URL scheme of a Sentinel-managed primary.
const SentinelScheme = "redis+sentinel"

// ParseSentinelURL parses
//
//	redis+sentinel://[user:password@]host1:port1[,host2:port2…]/master-name[/db]
//
// e.g. "redis+sentinel://h1:26379,h2:26379/mymaster/0": the sentinels'
// addresses (port default 26379), the master's name as the sentinels know
// it, and the database number (default 0). The user and password, when
// given, are the primary's (ACL user, requirepass), not the sentinels'. It
// returns go-redis's FailoverOptions with only those fields set. Errors: a
// malformed url, no sentinel, no master name, a db that is not a
// non-negative integer.
func ParseSentinelURL(url string) (*redis.FailoverOptions, error) {
	rest, ok := strings.CutPrefix(url, SentinelScheme+"://")
	if !ok {
		return nil, fmt.Errorf("redisq: sentinel url %q: want %s://host:port[,host:port…]/master[/db]", url, SentinelScheme)
	}
	fo := &redis.FailoverOptions{}
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		user, pass, _ := strings.Cut(rest[:at], ":")
		fo.Username, fo.Password = user, pass
		rest = rest[at+1:]
	}
	hosts, path, _ := strings.Cut(rest, "/")
	for _, h := range strings.Split(hosts, ",") {
		if h == "" {
			continue
		}
		if !strings.Contains(h, ":") {
			h += ":26379"
		}
		fo.SentinelAddrs = append(fo.SentinelAddrs, h)
	}
	if len(fo.SentinelAddrs) == 0 {
		return nil, fmt.Errorf("redisq: sentinel url %q: no sentinel address", url)
	}
	master, db, _ := strings.Cut(path, "/")
	if master == "" {
		return nil, fmt.Errorf("redisq: sentinel url %q: no master name (…/mymaster/0)", url)
	}
	fo.MasterName = master
	if db != "" {
		n, err := strconv.Atoi(db)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("redisq: sentinel url %q: db %q is not a non-negative integer", url, db)
		}
		fo.DB = n
	}
	return fo, nil
}

// ErrNotDurable is matched (errors.Is) by the *DurabilityError CheckDurability
// returns when the server may lose queued jobs.
var ErrNotDurable = errors.New("redisq: redis is not configured for durability")

// DurabilityError reports server settings under which queued jobs can be
// lost: appendonly other than "yes" (a restart loses everything since the
// last RDB snapshot) or a maxmemory-policy other than "noeviction" (Redis
// may evict stream or dedupe marks under memory pressure).
type DurabilityError struct {
	// AppendOnly is the server's "appendonly" setting ("yes" or "no").
	AppendOnly string
	// MaxMemoryPolicy is the server's "maxmemory-policy" (e.g. "noeviction").
	MaxMemoryPolicy string
}

// Error describes the unsafe settings.
func (e *DurabilityError) Error() string {
	var problems []string
	if e.AppendOnly != "yes" {
		problems = append(problems, fmt.Sprintf("appendonly is %q, want \"yes\" (a restart loses queued jobs)", e.AppendOnly))
	}
	if e.MaxMemoryPolicy != "noeviction" {
		problems = append(problems, fmt.Sprintf("maxmemory-policy is %q, want \"noeviction\" (keys may be evicted)", e.MaxMemoryPolicy))
	}
	return "redisq: redis may lose jobs: " + strings.Join(problems, "; ")
}

// Is reports whether target is ErrNotDurable.
func (e *DurabilityError) Is(target error) bool { return target == ErrNotDurable }

// durabilityFromInfo reads appendonly and maxmemory-policy from INFO.
func durabilityFromInfo(ctx context.Context, rdb redis.UniversalClient) (map[string]string, error) {
	info, err := rdb.Info(ctx, "persistence", "memory").Result()
	if err != nil {
		return nil, err
	}
	settings := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		switch k {
		case "aof_enabled":
			settings["appendonly"] = map[string]string{"1": "yes", "0": "no"}[v]
		case "maxmemory_policy":
			settings["maxmemory-policy"] = v
		}
	}
	if settings["appendonly"] == "" || settings["maxmemory-policy"] == "" {
		return nil, errors.New("INFO lacks aof_enabled or maxmemory_policy")
	}
	return settings, nil
}

// CheckDurability reads the server's appendonly and maxmemory-policy
// settings (CONFIG GET) and tells whether queued jobs survive a restart and
// memory pressure (a job acknowledged by nobody yet must not be lost to a
// restart without AOF or to eviction).
//
// It returns nil when appendonly is "yes" and maxmemory-policy is
// "noeviction". Otherwise it logs a warning on logger (nil = slog.Default())
// and returns a *DurabilityError (matching ErrNotDurable): the warning is
// deliberately loud, so callers that only want the log line may ignore the
// error. When the server refuses CONFIG (renamed, disabled or not permitted,
// as for a least-privilege ACL user: ACLRules), the same settings are read
// from INFO persistence and INFO memory (aof_enabled, maxmemory_policy);
// when INFO is refused too, it logs that durability could not be checked
// and returns nil. A connection
// error is returned wrapped. On a *redis.ClusterClient every master and
// replica is checked (ForEachShard): each unsafe node logs its own warning
// (with its address), the first one's *DurabilityError is returned, and a
// node that cannot be reached fails the check with its error. Safe for
// concurrent use.
func CheckDurability(ctx context.Context, rdb redis.UniversalClient, logger *slog.Logger) error {
	if logger == nil {
		logger = slog.Default()
	}
	logger = logger.With("component", "redisq")
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		var first error
		err := cc.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error {
			err := checkDurability(ctx, n, logger.With("node", n.Options().Addr))
			var derr *DurabilityError
			if errors.As(err, &derr) {
				mu.Lock()
				first = cmp.Or(first, err)
				mu.Unlock()
				return nil
			}
			return err
		})
		if err != nil {
			return err
		}
		return first
	}
	return checkDurability(ctx, rdb, logger)
}

// checkDurability is CheckDurability on one server.
func checkDurability(ctx context.Context, rdb redis.UniversalClient, logger *slog.Logger) error {
	settings, err := durabilitySettings(ctx, rdb)
	if err != nil {
		return err
	}
	if settings == nil {
		logger.WarnContext(ctx, "could not check redis durability settings: CONFIG GET and INFO refused")
		return nil
	}
	derr := &DurabilityError{AppendOnly: settings["appendonly"], MaxMemoryPolicy: settings["maxmemory-policy"]}
	if derr.AppendOnly == "yes" && derr.MaxMemoryPolicy == "noeviction" {
		return nil
	}
	logger.WarnContext(ctx, "REDIS IS NOT DURABLE: queued jobs can be lost",
		"appendonly", derr.AppendOnly, "maxmemory_policy", derr.MaxMemoryPolicy,
		"want", "appendonly yes, maxmemory-policy noeviction")
	return derr
}

// durabilitySettings reads appendonly and maxmemory-policy from one node:
// CONFIG GET, or INFO when CONFIG is refused; nil settings and no error
// when both are refused; a connection error wrapped.
func durabilitySettings(ctx context.Context, rdb redis.UniversalClient) (map[string]string, error) {
	settings := map[string]string{}
	for _, name := range []string{"appendonly", "maxmemory-policy"} {
		vals, err := rdb.ConfigGet(ctx, name).Result()
		if err != nil {
			var rerr redis.Error
			if errors.As(err, &rerr) {
				if settings, err = durabilityFromInfo(ctx, rdb); err != nil {
					return nil, nil
				}
				return settings, nil
			}
			return nil, fmt.Errorf("redisq: checking durability: config get %s: %w", name, err)
		}
		settings[name] = vals[name]
	}
	return settings, nil
}

// NodeDurability is one Redis node's durability settings (ReadDurability).
type NodeDurability struct {
	// Addr is the node's address ("host:port"): as the client knows it,
	// or for a Sentinel client its current master's as the master reports
	// it (CLIENT INFO laddr; "FailoverClient" when that is refused).
	Addr string
	// AppendOnly and MaxMemoryPolicy are the node's settings; both "" when
	// they could not be read (Err says why; nil Err: the server refused
	// CONFIG and INFO).
	AppendOnly, MaxMemoryPolicy string
	// Err is why the node could not be read, or nil.
	Err error
}

// Known reports whether the settings were read.
func (n NodeDurability) Known() bool { return n.AppendOnly != "" }

// Durable reports whether the settings were read and keep queued jobs:
// appendonly "yes" and maxmemory-policy "noeviction".
func (n NodeDurability) Durable() bool {
	return n.AppendOnly == "yes" && n.MaxMemoryPolicy == "noeviction"
}

// Problem describes what is unsafe about the node ("" when durable or not
// known): the DurabilityError text.
func (n NodeDurability) Problem() string {
	if !n.Known() || n.Durable() {
		return ""
	}
	return (&DurabilityError{AppendOnly: n.AppendOnly, MaxMemoryPolicy: n.MaxMemoryPolicy}).Error()
}

// ReadDurability reads the durability settings of every node rdb talks
// to: each master and replica of a *redis.ClusterClient (ForEachShard),
// else the one server (through Sentinel, the current primary: its
// replicas are not read, though one of them becomes the primary after a
// failover, when the next call reads it). It logs nothing and never fails as a whole: a node
// that cannot be read has Err set. Safe for concurrent use.
func ReadDurability(ctx context.Context, rdb redis.UniversalClient) []NodeDurability {
	read := func(ctx context.Context, c *redis.Client) NodeDurability {
		n := NodeDurability{Addr: c.Options().Addr}
		if n.Addr == "FailoverClient" {
			if ci, err := c.ClientInfo(ctx).Result(); err == nil && ci.LAddr != "" {
				n.Addr = ci.LAddr
			}
		}
		settings, err := durabilitySettings(ctx, c)
		n.Err = err
		if settings != nil {
			n.AppendOnly, n.MaxMemoryPolicy = settings["appendonly"], settings["maxmemory-policy"]
		}
		return n
	}
	switch c := rdb.(type) {
	case *redis.Client:
		return []NodeDurability{read(ctx, c)}
	case *redis.ClusterClient:
		var mu sync.Mutex
		var out []NodeDurability
		err := c.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error {
			d := read(ctx, n)
			mu.Lock()
			out = append(out, d)
			mu.Unlock()
			return nil
		})
		if err != nil && len(out) == 0 {
			return []NodeDurability{{Addr: "cluster", Err: err}}
		}
		slices.SortFunc(out, func(a, b NodeDurability) int { return strings.Compare(a.Addr, b.Addr) })
		return out
	}
	settings, err := durabilitySettings(ctx, rdb)
	n := NodeDurability{Addr: "redis", Err: err}
	if settings != nil {
		n.AppendOnly, n.MaxMemoryPolicy = settings["appendonly"], settings["maxmemory-policy"]
	}
	return []NodeDurability{n}
}

// ReplicasInSync returns, per master rdb adds to, how many of its replicas
// are in sync (INFO replication: a connected replica whose state is
// online), the number a WAIT can count (PublisherConfig.ReplicaAcks): every
// master of a *redis.ClusterClient, keyed by its address, else the one
// server (through Sentinel the current primary), keyed "redis". A master
// that cannot be read is left out and its error joined into err. It needs
// INFO (the ACL rules of ACLRules allow it). Safe for concurrent use.
func ReplicasInSync(ctx context.Context, rdb redis.UniversalClient) (map[string]int, error) {
	out := map[string]int{}
	var mu sync.Mutex
	var errs []error
	read := func(ctx context.Context, c redis.Cmdable, addr string) {
		info, err := c.Info(ctx, "replication").Result()
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			errs = append(errs, fmt.Errorf("redisq: replicas of %s: %w", addr, err))
			return
		}
		n := 0
		for _, line := range strings.Split(info, "\n") {
			if strings.HasPrefix(line, "slave") && strings.Contains(line, ":ip=") && strings.Contains(line, ",state=online,") {
				n++
			}
		}
		out[addr] = n
	}
	if c, ok := rdb.(*redis.ClusterClient); ok {
		err := c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			read(ctx, n, n.Options().Addr)
			return nil
		})
		if err != nil {
			errs = append(errs, err)
		}
	} else {
		read(ctx, rdb, "redis")
	}
	return out, errors.Join(errs...)
}
