package status

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/presence"
	"github.com/outboxchat/outboxchat/chat/schema"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/natsq"
	"github.com/outboxchat/outboxchat/outbox"
	"github.com/outboxchat/outboxchat/redisq"
)

// The operator's snapshot of the two services: `outboxchat status` prints
// it and each service's gauges export their part of it. Every figure comes
// from the few queries below, run on demand (status) or at most once per
// statusCacheTTL (a scrape), never per message.

// StatusThresholds say when a figure needs a person (Status.Problems; the
// status command then exits 1). A zero field means its default.
type StatusThresholds struct {
	// BacklogAge: the oldest unsent outbox row is older than this.
	// Default DefaultMaxBacklogAge (1 min).
	BacklogAge time.Duration
	// TransactionAge: a transaction or snapshot the database can see is
	// older than this (it holds back cleanup). Default
	// DefaultMaxTransactionAge (10 min).
	TransactionAge time.Duration
}

// CommandFlags are the connection flags ReadStatus appends to the commands
// its problems suggest, so that each runs as printed: Database (e.g.
// `--database-url 'postgres://…'`) to those that read the database, Redis
// (e.g. `--redis-url 'redis://…' --redis-prefix p`) to those that read
// Redis. "" adds nothing: right when the command finds the connection
// where status found it (DATABASE_URL, REDIS_URL).
type CommandFlags struct {
	Database, Redis string
	// Broker (e.g. `--broker-url 'nats://…'`) goes to those that read the
	// queue on NATS (with ReadStatus's nc set), in place of Redis.
	Broker string
}

// with appends flags (when set) to a suggested command line.
func with(cmd, flags string) string {
	if flags == "" {
		return cmd
	}
	return cmd + " " + flags
}

// Status thresholds' defaults.
const (
	DefaultMaxBacklogAge     = time.Minute
	DefaultMaxTransactionAge = 10 * time.Minute
)

// Status is what `outboxchat status --json` prints.
type Status struct {
	Services []ServiceStatus `json:"services"`
	Database DatabaseStatus  `json:"database"`
	// Redis is every Redis node's durability settings (empty without
	// --redis-url).
	Redis []RedisNodeStatus `json:"redis"`
	// Problems lists what needs a person, one sentence each; empty when
	// healthy.
	Problems []string `json:"problems"`
	// Healthy is len(Problems) == 0.
	Healthy bool `json:"healthy"`
}

// ServiceStatus is one service: its outbox (what it sends) and its consumer
// group on the stream it reads.
type ServiceStatus struct {
	Service string `json:"service"`
	// Unsent, OldestUnsentSeconds (database clock; 0 when none) and Parked
	// describe the outbox (messages and receipts).
	Unsent              int64   `json:"unsent"`
	OldestUnsentSeconds float64 `json:"oldest_unsent_seconds"`
	Parked              int64   `json:"parked"`
	// LastRelayPassSeconds is how long ago, by the database clock, a relay
	// of the service last committed a pass (its heartbeat, written at most
	// every 5 s, so up to about 5 s stale); null when no relay ever ran.
	LastRelayPassSeconds *float64 `json:"last_relay_pass_seconds"`
	// Stream is the stream the service reads (the peer's messages);
	// StreamLength its entries, StreamPending and StreamLag the service's
	// consumer group's pending and undelivered entries.
	Stream        string           `json:"stream"`
	StreamLength  int64            `json:"stream_length"`
	StreamPending int64            `json:"stream_pending"`
	StreamLag     int64            `json:"stream_lag"`
	Consumers     []ConsumerStatus `json:"consumers"`
	// DeadLetters is the length of that stream's dead-letter stream.
	DeadLetters int64 `json:"dead_letters"`
	// Relays are the service's relays that committed a pass within
	// RelayLiveWindow (their heartbeat rows), newest first.
	Relays []RelayStatus `json:"relays"`
	// LiveConsumers are the processes live in the group's presence set
	// (presence.Live): consumer name and instance id each.
	LiveConsumers []LiveConsumerStatus `json:"live_consumers"`
	// SharedConsumerNames are the consumer names more than one live
	// process uses (each a problem).
	SharedConsumerNames []string `json:"shared_consumer_names"`
	// LostSeqs counts the seqs this service published that its database
	// no longer holds because it lost commits (a failover to a replica
	// that had not received them, a restore): the seq fence recorded them
	// in seq_lost (migration 014) when it fenced the new incarnation. Any
	// is a problem: those messages were sent (2xx) and only the old
	// primary had them.
	LostSeqs int64 `json:"lost_seqs"`
	// Partitions lists each partition's figures (serve --partitions): its
	// outbox, its stream and its relay lease. One element (partition 0)
	// for a deployment without partitions. The service's figures above
	// are their sums (the oldest unsent row: their maximum; Stream:
	// partition 0's).
	Partitions []PartitionStatus `json:"partitions"`
	// Drained is true when nothing is on its way in either lane of the
	// service: no unsent outbox row, and no pending or undelivered entry
	// in the group on any stream it reads. Change --partitions only when
	// both services are drained (docs/DEPLOYING.md). It is false, too,
	// when status could not read all of the service's figures (Errors is
	// not empty: without --redis-url, say), for then it cannot tell;
	// NotRead says what it did not read.
	Drained bool `json:"drained"`
	// Errors lists what could not be read ("database: …", "redis: …",
	// "nats: …").
	Errors []string `json:"errors,omitempty"`
}

// NotRead returns what status could not read of the service, each once,
// in the order of Errors: "database", "redis" or "nats" (the part of each
// error before its first colon). It is nil when every figure was read:
// only then does a false Drained mean that something is on its way.
func (s *ServiceStatus) NotRead() []string {
	var out []string
	for _, e := range s.Errors {
		src, _, _ := strings.Cut(e, ":")
		if !slices.Contains(out, src) {
			out = append(out, src)
		}
	}
	return out
}

// PartitionStatus is one partition of a service: the outbox table it
// sends from, the stream of the peer it reads, and the lease of its relay.
type PartitionStatus struct {
	Partition int `json:"partition"`
	// Outbox is the outbox table (chat.OutboxTable); Unsent,
	// OldestUnsentSeconds and Parked its figures, as the service's.
	Outbox              string  `json:"outbox"`
	Unsent              int64   `json:"unsent"`
	OldestUnsentSeconds float64 `json:"oldest_unsent_seconds"`
	Parked              int64   `json:"parked"`
	// Stream is the stream of the partition the service reads; its
	// length, the group's pending and undelivered entries and the
	// dead-letter stream's length, as the service's.
	Stream        string `json:"stream"`
	StreamLength  int64  `json:"stream_length"`
	StreamPending int64  `json:"stream_pending"`
	StreamLag     int64  `json:"stream_lag"`
	DeadLetters   int64  `json:"dead_letters"`
	// LeaseOwner is the relay process holding the partition's lease
	// (consumer name and a random suffix), "" when none holds a live one
	// (and always with one partition, which has no leases).
	LeaseOwner string `json:"lease_owner"`
}

// RelayLiveWindow is how recent a relay's last pass must be for status to
// count it as running (its heartbeat is written every 5 s while it passes).
const RelayLiveWindow = time.Minute

// RelayStatus is one running relay (a relay_heartbeat row).
type RelayStatus struct {
	// Name is the relay process's consumer name.
	Name string `json:"name"`
	// LastPassSeconds is how long ago, by the database clock, it last
	// committed a pass.
	LastPassSeconds float64 `json:"last_pass_seconds"`
	// Listening is whether its LISTEN connection was up; null for a
	// poll-only relay (or one that has not said).
	Listening *bool `json:"listening"`
}

// LiveConsumerStatus is one live process of a consumer group.
type LiveConsumerStatus struct {
	Name     string `json:"name"`
	Instance string `json:"instance"`
}

// ConsumerStatus is one member of a service's consumer group.
type ConsumerStatus struct {
	Name        string  `json:"name"`
	Pending     int64   `json:"pending"`
	IdleSeconds float64 `json:"idle_seconds"`
	// Processes is how many live processes use the name (0: none, e.g. a
	// consumer that is gone; more than 1: shared, a problem).
	Processes int `json:"processes"`
}

// RedisNodeStatus is one Redis node's durability (redisq.ReadDurability).
type RedisNodeStatus struct {
	Addr string `json:"addr"`
	// AppendOnly and MaxMemoryPolicy are "" when they could not be read.
	AppendOnly      string `json:"appendonly"`
	MaxMemoryPolicy string `json:"maxmemory_policy"`
	// Durable is appendonly yes and maxmemory-policy noeviction; null when
	// unknown (Error, or CONFIG and INFO refused).
	Durable *bool  `json:"durable"`
	Error   string `json:"error,omitempty"`
}

// RedisStatus reads the durability of every node of rdb.
func RedisStatus(ctx context.Context, rdb redis.UniversalClient) []RedisNodeStatus {
	var out []RedisNodeStatus
	for _, n := range redisq.ReadDurability(ctx, rdb) {
		s := RedisNodeStatus{Addr: n.Addr, AppendOnly: n.AppendOnly, MaxMemoryPolicy: n.MaxMemoryPolicy}
		if n.Err != nil {
			s.Error = n.Err.Error()
		}
		if n.Known() {
			d := n.Durable()
			s.Durable = &d
		}
		out = append(out, s)
	}
	return out
}

// DatabaseStatus is the database's cleanup horizon (see horizonCollector).
type DatabaseStatus struct {
	OldestXminAgeXids        float64 `json:"oldest_xmin_age_xids"`
	OldestTransactionSeconds float64 `json:"oldest_transaction_seconds"`
	Error                    string  `json:"error,omitempty"`
}

// OutboxStatus reads into s a service's outbox figures and its relays' newest
// heartbeat. db needs SELECT on the service's outbox and relay_heartbeat;
// the error is the first query's that failed.
func OutboxStatus(ctx context.Context, db outbox.DB, service string, s *ServiceStatus) error {
	parts, err := schema.PartitionTables(ctx, db, service)
	if err != nil {
		return err
	}
	owners := map[int]string{}
	if len(parts) > 1 {
		rows, err := db.Query(ctx, "SELECT partition, owner FROM "+pgx.Identifier{service, "partition_leases"}.Sanitize()+
			" WHERE owner IS NOT NULL AND expires_at > now()")
		if err != nil {
			return fmt.Errorf("partition leases: %w", err)
		}
		var p int
		var o string
		if _, err := pgx.ForEachRow(rows, []any{&p, &o}, func() error { owners[p] = o; return nil }); err != nil {
			return fmt.Errorf("partition leases: %w", err)
		}
	}
	s.Partitions = s.Partitions[:0]
	s.Unsent, s.Parked, s.OldestUnsentSeconds = 0, 0, 0
	for _, p := range parts {
		table := chat.OutboxTable(service, p)
		st, err := outbox.ReadStats(ctx, db, table)
		if err != nil {
			return err
		}
		s.Partitions = append(s.Partitions, PartitionStatus{Partition: p, Outbox: table, Unsent: st.Unsent,
			OldestUnsentSeconds: st.OldestUnsent.Seconds(), Parked: st.Parked, LeaseOwner: owners[p]})
		s.Unsent += st.Unsent
		s.Parked += st.Parked
		s.OldestUnsentSeconds = max(s.OldestUnsentSeconds, st.OldestUnsent.Seconds())
	}
	var ago *float64
	if err := db.QueryRow(ctx, "SELECT extract(epoch FROM now() - max(pass_at))::float8 FROM "+
		pgx.Identifier{service, "relay_heartbeat"}.Sanitize()).Scan(&ago); err != nil {
		return fmt.Errorf("relay heartbeat: %w", err)
	}
	if ago != nil {
		a := max(*ago, 0)
		ago = &a
	}
	s.LastRelayPassSeconds = ago
	rows, err := db.Query(ctx, "SELECT relay, greatest(extract(epoch FROM now() - pass_at), 0)::float8, listening FROM "+
		pgx.Identifier{service, "relay_heartbeat"}.Sanitize()+" WHERE pass_at > now() - $1::bigint * interval '1 millisecond' ORDER BY pass_at DESC",
		RelayLiveWindow.Milliseconds())
	if err != nil {
		return fmt.Errorf("relay heartbeats: %w", err)
	}
	s.Relays, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (RelayStatus, error) {
		var rs RelayStatus
		return rs, r.Scan(&rs.Name, &rs.LastPassSeconds, &rs.Listening)
	})
	if err != nil {
		return fmt.Errorf("relay heartbeats: %w", err)
	}
	if err := db.QueryRow(ctx, "SELECT coalesce(sum(to_seq - from_seq + 1), 0)::bigint FROM "+
		pgx.Identifier{service, "seq_lost"}.Sanitize()).Scan(&s.LostSeqs); err != nil {
		return fmt.Errorf("lost seqs: %w", err)
	}
	return nil
}

// QueueStatus reads into s the stream service reads (keys under prefix)
// and its consumer group there, with the dead-letter stream's length.
func QueueStatus(ctx context.Context, rdb redis.UniversalClient, prefix, service string, s *ServiceStatus) error {
	if len(s.Partitions) == 0 { // the database could not say: partition 0 at least
		s.Partitions = []PartitionStatus{{Partition: 0, Outbox: chat.OutboxTable(service, 0)}}
	}
	s.Consumers = []ConsumerStatus{}
	s.StreamLength, s.StreamPending, s.StreamLag, s.DeadLetters = 0, 0, 0, 0
	byName := map[string]int{} // consumer name → index in s.Consumers
	for i := range s.Partitions {
		ps := &s.Partitions[i]
		qi, err := redisq.Inspect(ctx, rdb, prefix, chat.PartitionQueue(chat.Peer(service), ps.Partition))
		if err != nil {
			return err
		}
		ps.Stream, ps.StreamLength, ps.DeadLetters = qi.Stream, qi.Length, qi.DeadLetters
		ps.StreamLag = qi.Length // no group yet: nothing was delivered
		for _, g := range qi.Groups {
			if g.Name != service {
				continue
			}
			ps.StreamPending, ps.StreamLag = g.Pending, g.Lag
			// A process's consumer has one name on every partition's
			// stream: one entry per name, its pending summed, its
			// shortest idle time.
			for _, c := range g.Consumers {
				if k, ok := byName[c.Name]; ok {
					s.Consumers[k].Pending += c.Pending
					s.Consumers[k].IdleSeconds = min(s.Consumers[k].IdleSeconds, c.Idle.Seconds())
					continue
				}
				byName[c.Name] = len(s.Consumers)
				s.Consumers = append(s.Consumers, ConsumerStatus{Name: c.Name, Pending: c.Pending, IdleSeconds: c.Idle.Seconds()})
			}
		}
		if ps.Partition == 0 {
			s.Stream = qi.Stream
		}
		s.StreamLength += ps.StreamLength
		s.StreamPending += ps.StreamPending
		s.StreamLag += ps.StreamLag
		s.DeadLetters += ps.DeadLetters
	}
	return presenceStatus(ctx, rdb, prefix, service, s)
}

// presenceStatus reads into s the live processes of service's consumer
// group from Redis's presence set, and counts each consumer's processes.
func presenceStatus(ctx context.Context, rdb redis.UniversalClient, prefix, service string, s *ServiceStatus) error {
	// The presence set is partition 0's queue's (one per process).
	live, err := presence.Live(ctx, rdb, prefix, chat.QueueName(chat.Peer(service)))
	if err != nil {
		return err
	}
	s.LiveConsumers, s.SharedConsumerNames = []LiveConsumerStatus{}, []string{}
	count := map[string]int{}
	for _, l := range live {
		// A process refreshes its entry every third of its ttl: one with
		// less than half left has missed a refresh (it died, e.g. before
		// its replacement took the name), and is not counted.
		if l.Group != service || l.Remaining < presence.DefaultTTL/2 {
			continue
		}
		s.LiveConsumers = append(s.LiveConsumers, LiveConsumerStatus{Name: l.Name, Instance: l.Instance})
		if count[l.Name]++; count[l.Name] == 2 {
			s.SharedConsumerNames = append(s.SharedConsumerNames, l.Name)
		}
	}
	for i := range s.Consumers {
		s.Consumers[i].Processes = count[s.Consumers[i].Name]
	}
	return nil
}

// NATSQueueStatus is QueueStatus with the queue on NATS JetStream (serve
// --broker-url): per partition, the stream service reads (named as serve
// names it: natsq.Names of chat.NATSName(prefix) and of the queue), its
// length in events, the group's durable consumer's unacknowledged events
// (StreamPending) and undelivered ones (StreamLag), and the length of the
// dead-letter stream; a stream or consumer not made yet counts as empty.
// JetStream keeps no per-member figures: Consumers stays empty, and the
// live processes come from Redis's presence set when rdb is set.
func NATSQueueStatus(ctx context.Context, nc *nats.Conn, rdb redis.UniversalClient, prefix, service string, s *ServiceStatus) error {
	if len(s.Partitions) == 0 {
		s.Partitions = []PartitionStatus{{Partition: 0, Outbox: chat.OutboxTable(service, 0)}}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	s.Consumers = []ConsumerStatus{}
	s.StreamLength, s.StreamPending, s.StreamLag, s.DeadLetters = 0, 0, 0, 0
	for i := range s.Partitions {
		ps := &s.Partitions[i]
		stream, dead, _ := natsq.Names(chat.NATSName(prefix), chat.NATSName(chat.PartitionQueue(chat.Peer(service), ps.Partition)))
		ps.Stream = stream
		if ps.StreamLength, err = streamMsgs(ctx, js, stream); err != nil {
			return err
		}
		if ps.DeadLetters, err = streamMsgs(ctx, js, dead); err != nil {
			return err
		}
		ps.StreamLag = ps.StreamLength // no consumer yet: nothing was delivered
		c, err := js.Consumer(ctx, stream, chat.NATSName(service))
		switch {
		case err == nil:
			info := c.CachedInfo()
			ps.StreamPending, ps.StreamLag = int64(info.NumAckPending), int64(info.NumPending)
		case !errors.Is(err, jetstream.ErrConsumerNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound):
			return fmt.Errorf("consumer %s on %s: %w", service, stream, err)
		}
		if ps.Partition == 0 {
			s.Stream = stream
		}
		s.StreamLength += ps.StreamLength
		s.StreamPending += ps.StreamPending
		s.StreamLag += ps.StreamLag
		s.DeadLetters += ps.DeadLetters
	}
	if rdb == nil {
		return nil
	}
	return presenceStatus(ctx, rdb, prefix, service, s)
}

// streamMsgs returns how many messages JetStream stream name holds, 0
// when there is no such stream.
func streamMsgs(ctx context.Context, js jetstream.JetStream, name string) (int64, error) {
	st, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w", name, err)
	}
	return int64(st.CachedInfo().State.Msgs), nil
}

// ReadStatus reads both services' Status through db (a role that can read
// both schemas and pg_stat_activity: the database owner or a superuser;
// with a service's own role the other service reports an error), rdb
// (nil: the Redis figures are left out, with an error) and nc (the queue
// on NATS JetStream, serve --broker-url: its figures are read there, not
// in Redis; nil: the queue is Redis Streams), keys under prefix
// ("" = DefaultRedisPrefix), and judges it by th; the commands its
// problems suggest carry cf's flags. It returns an error only
// when ctx ends; what it cannot read is in the ServiceStatus's Errors and
// counts as a problem.
func ReadStatus(ctx context.Context, db outbox.DB, rdb redis.UniversalClient, nc *nats.Conn, prefix string, th StatusThresholds, cf CommandFlags) (*Status, error) {
	if prefix == "" {
		prefix = chat.DefaultRedisPrefix
	}
	if th.BacklogAge <= 0 {
		th.BacklogAge = DefaultMaxBacklogAge
	}
	if th.TransactionAge <= 0 {
		th.TransactionAge = DefaultMaxTransactionAge
	}
	st := &Status{Problems: []string{}, Redis: []RedisNodeStatus{}}
	if rdb != nil {
		st.Redis = RedisStatus(ctx, rdb)
		for _, n := range st.Redis {
			switch {
			case n.Error != "":
				st.Problems = append(st.Problems, fmt.Sprintf("redis %s: cannot read its durability settings: %s", n.Addr, n.Error))
			case n.Durable != nil && !*n.Durable:
				st.Problems = append(st.Problems, fmt.Sprintf("redis %s: NOT DURABLE: appendonly %q, maxmemory-policy %q (want yes, noeviction): a restart or memory pressure loses queued jobs; run CONFIG SET appendonly yes and CONFIG SET maxmemory-policy noeviction, and put them in redis.conf",
					n.Addr, n.AppendOnly, n.MaxMemoryPolicy))
			}
		}
	}
	for _, svc := range []string{chat.Consumers, chat.Workers} {
		s := ServiceStatus{Service: svc, Consumers: []ConsumerStatus{}, Relays: []RelayStatus{}, Partitions: []PartitionStatus{},
			LiveConsumers: []LiveConsumerStatus{}, SharedConsumerNames: []string{}}
		if err := OutboxStatus(ctx, db, svc, &s); err != nil {
			s.Errors = append(s.Errors, "database: "+err.Error())
		}
		switch {
		case nc != nil:
			if err := NATSQueueStatus(ctx, nc, rdb, prefix, svc, &s); err != nil {
				s.Errors = append(s.Errors, "nats: "+err.Error())
			}
		case rdb == nil:
			s.Errors = append(s.Errors, "redis: no --redis-url (or REDIS_URL)")
		default:
			if err := QueueStatus(ctx, rdb, prefix, svc, &s); err != nil {
				s.Errors = append(s.Errors, "redis: "+err.Error())
			}
		}
		s.Drained = len(s.Errors) == 0 && s.Unsent == 0 && s.StreamPending == 0 && s.StreamLag == 0
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		for _, e := range s.Errors {
			st.Problems = append(st.Problems, fmt.Sprintf("%s: cannot read: %s", svc, e))
		}
		for _, p := range s.Partitions {
			if p.OldestUnsentSeconds > th.BacklogAge.Seconds() {
				st.Problems = append(st.Problems, fmt.Sprintf("%s: oldest unsent outbox row is %.0f s old in %s (threshold %v): is its relay running (with partitions: a live lease, lease_owner) and Redis reachable?",
					svc, p.OldestUnsentSeconds, p.Outbox, th.BacklogAge))
			}
		}
		for _, p := range s.Partitions {
			if p.Parked > 0 {
				st.Problems = append(st.Problems, fmt.Sprintf("%s: %d parked outbox row(s) in %s: see `%s`",
					svc, p.Parked, p.Outbox, with("outboxchat outbox parked --service "+svc+partitionFlag(p.Partition), cf.Database)))
			}
		}
		for _, name := range s.SharedConsumerNames {
			var who []string
			for _, l := range s.LiveConsumers {
				if l.Name == name {
					who = append(who, l.Instance)
				}
			}
			st.Problems = append(st.Problems, fmt.Sprintf("%s: consumer name %q is used by %d live processes (%s): they share one pending list; give each its own --consumer-name, or leave it unset for a unique one",
				svc, name, len(who), strings.Join(who, ", ")))
		}
		for _, r := range s.Relays {
			if r.Listening != nil && !*r.Listening {
				st.Problems = append(st.Problems, fmt.Sprintf("%s: relay %s is not listening (its LISTEN connection is down): it finds new outbox rows only at its poll, so messages are late; check its database connection (behind a transaction-mode pooler, --listen-database-url)",
					svc, r.Name))
			}
		}
		if s.LostSeqs > 0 {
			st.Problems = append(st.Problems, fmt.Sprintf("%s: %d sent message(s) lost with commits the database lost (failover or restore): see %s.seq_lost; only the old primary had them",
				svc, s.LostSeqs, svc))
		}
		if s.DeadLetters > 0 {
			dlFlags := cf.Redis
			if nc != nil {
				dlFlags = cf.Broker
			}
			for _, p := range s.Partitions {
				if p.DeadLetters > 0 {
					st.Problems = append(st.Problems, fmt.Sprintf("%s: %d dead letter(s) on %s: see `%s`",
						svc, p.DeadLetters, chat.PartitionQueue(chat.Peer(svc), p.Partition),
						with("outboxchat deadletters list --service "+svc+partitionFlag(p.Partition), dlFlags)))
				}
			}
		}
		st.Services = append(st.Services, s)
	}
	if err := db.QueryRow(ctx, HorizonSQL).Scan(&st.Database.OldestXminAgeXids, &st.Database.OldestTransactionSeconds); err != nil {
		st.Database.Error = err.Error()
		st.Problems = append(st.Problems, "database: cannot read the cleanup horizon: "+err.Error())
	} else if st.Database.OldestTransactionSeconds > th.TransactionAge.Seconds() {
		st.Problems = append(st.Problems, fmt.Sprintf("database: a transaction or snapshot is %.0f s old (threshold %v): it holds back cleanup and slows the queue tables; find it in pg_stat_activity (xact_start) and end it",
			st.Database.OldestTransactionSeconds, th.TransactionAge))
	}
	st.Healthy = len(st.Problems) == 0
	return st, nil
}

// partitionFlag is " --partition P" for a partition above 0, "" for 0
// (the commands' default).
func partitionFlag(p int) string {
	if p == 0 {
		return ""
	}
	return fmt.Sprintf(" --partition %d", p)
}

// HorizonSQL reads how far back the oldest transaction or snapshot holds
// the database's xmin horizon: the age in transaction ids of the oldest
// backend xid/xmin of this database, replication slot xmin and prepared
// transaction, and the age in seconds of the oldest xact_start that this
// role may see in pg_stat_activity (two float8 columns).
const HorizonSQL = `SELECT
	coalesce(greatest(
		(SELECT max(greatest(age(backend_xid), age(backend_xmin))) FROM pg_stat_activity
			WHERE datid = (SELECT oid FROM pg_database WHERE datname = current_database()) OR datid IS NULL),
		(SELECT max(greatest(age(xmin), age(catalog_xmin))) FROM pg_replication_slots),
		(SELECT max(age(transaction)) FROM pg_prepared_xacts)), 0)::float8,
	coalesce((SELECT extract(epoch FROM now() - min(xact_start)) FROM pg_stat_activity
		WHERE backend_xid IS NOT NULL OR backend_xmin IS NOT NULL), 0)::float8`
