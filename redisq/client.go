package redisq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/internal/nodeinfo"
	"github.com/outboxchat/outboxchat/internal/redisclient"
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
	c, err := redisclient.New(url, redisclient.Settings{
		DialTimeout: ClientDialTimeout, ReadTimeout: ClientReadTimeout,
		WriteTimeout: ClientWriteTimeout, PoolTimeout: ClientPoolTimeout, PoolSize: poolSize,
		MaxRedirects: ClusterMaxRedirects, MinRetryBackoff: ClusterMinRetryBackoff, MaxRetryBackoff: ClusterMaxRetryBackoff,
		ClusterDown: func(reply error) error { return &ClusterDownError{Err: reply} },
	})
	if err != nil {
		return nil, fmt.Errorf("redisq: %w", err)
	}
	return c, nil
}

// TLSCAFileParam, "tls_ca_file", is NewClient's URL parameter naming a
// file of CA certificates (PEM) that a rediss:// server's certificate must
// chain to.
const TLSCAFileParam = redisclient.TLSCAFileParam

// SentinelScheme, "redis+sentinel", is the URL scheme of a Sentinel-managed
// primary.
const SentinelScheme = redisclient.SentinelScheme

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
	fo, err := redisclient.Sentinel(url)
	if err != nil {
		return nil, fmt.Errorf("redisq: %w", err)
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
	d, known, err := nodeinfo.ReadDurability(ctx, rdb)
	if err != nil {
		return fmt.Errorf("redisq: %w", err)
	}
	if !known {
		logger.WarnContext(ctx, "could not check redis durability settings: CONFIG GET and INFO refused")
		return nil
	}
	derr := &DurabilityError{AppendOnly: d.AppendOnly, MaxMemoryPolicy: d.MaxMemoryPolicy}
	if derr.AppendOnly == "yes" && derr.MaxMemoryPolicy == "noeviction" {
		return nil
	}
	logger.WarnContext(ctx, "REDIS IS NOT DURABLE: queued jobs can be lost",
		"appendonly", derr.AppendOnly, "maxmemory_policy", derr.MaxMemoryPolicy,
		"want", "appendonly yes, maxmemory-policy noeviction")
	return derr
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
	nodes := nodeinfo.EachDurability(ctx, rdb)
	out := make([]NodeDurability, len(nodes))
	for i, n := range nodes {
		if n.Err != nil {
			n.Err = fmt.Errorf("redisq: %w", n.Err)
		}
		out[i] = NodeDurability(n)
	}
	return out
}

// ReplicasInSync returns, per master rdb adds to, how many of its replicas
// are in sync (INFO replication: a connected replica whose state is
// online), the number a WAIT can count (PublisherConfig.ReplicaAcks): every
// master of a *redis.ClusterClient, keyed by its address, else the one
// server (through Sentinel the current primary), keyed "redis". A master
// that cannot be read is left out and its error joined into err. It needs
// INFO (the ACL rules of ACLRules allow it). Safe for concurrent use.
func ReplicasInSync(ctx context.Context, rdb redis.UniversalClient) (map[string]int, error) {
	out, err := nodeinfo.ReplicasInSync(ctx, rdb)
	if err != nil {
		return out, fmt.Errorf("redisq: %w", err)
	}
	return out, nil
}
