package chat

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

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
	// older than this (it holds back cleanup; issue 17). Default
	// DefaultMaxTransactionAge (10 min).
	TransactionAge time.Duration
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
	// Errors lists what could not be read ("database: …", "redis: …").
	Errors []string `json:"errors,omitempty"`
}

// ConsumerStatus is one member of a service's consumer group.
type ConsumerStatus struct {
	Name        string  `json:"name"`
	Pending     int64   `json:"pending"`
	IdleSeconds float64 `json:"idle_seconds"`
}

// DatabaseStatus is the database's cleanup horizon (see horizonCollector).
type DatabaseStatus struct {
	OldestXminAgeXids        float64 `json:"oldest_xmin_age_xids"`
	OldestTransactionSeconds float64 `json:"oldest_transaction_seconds"`
	Error                    string  `json:"error,omitempty"`
}

// outboxStatus reads a service's outbox figures and its relays' newest
// heartbeat. db needs SELECT on the service's outbox and relay_heartbeat.
func outboxStatus(ctx context.Context, db outbox.DB, service string, s *ServiceStatus) error {
	st, err := outbox.ReadStats(ctx, db, service+".outbox")
	if err != nil {
		return err
	}
	s.Unsent, s.Parked, s.OldestUnsentSeconds = st.Unsent, st.Parked, st.OldestUnsent.Seconds()
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
	return nil
}

// queueStatus reads the stream service reads and its group there.
func queueStatus(ctx context.Context, rdb redis.UniversalClient, prefix, service string, s *ServiceStatus) error {
	qi, err := redisq.Inspect(ctx, rdb, prefix, QueueName(Peer(service)))
	if err != nil {
		return err
	}
	s.Stream, s.StreamLength, s.DeadLetters = qi.Stream, qi.Length, qi.DeadLetters
	s.StreamLag = qi.Length // no group yet: nothing was delivered
	s.Consumers = []ConsumerStatus{}
	for _, g := range qi.Groups {
		if g.Name != service {
			continue
		}
		s.StreamPending, s.StreamLag = g.Pending, g.Lag
		for _, c := range g.Consumers {
			s.Consumers = append(s.Consumers, ConsumerStatus{Name: c.Name, Pending: c.Pending, IdleSeconds: c.Idle.Seconds()})
		}
	}
	return nil
}

// ReadStatus reads both services' Status through db (a role that can read
// both schemas and pg_stat_activity: the database owner or a superuser;
// with a service's own role the other service reports an error) and rdb
// (nil: the Redis figures are left out, with an error), keys under prefix
// ("" = DefaultRedisPrefix), and judges it by th. It returns an error only
// when ctx ends; what it cannot read is in the ServiceStatus's Errors and
// counts as a problem.
func ReadStatus(ctx context.Context, db outbox.DB, rdb redis.UniversalClient, prefix string, th StatusThresholds) (*Status, error) {
	if prefix == "" {
		prefix = DefaultRedisPrefix
	}
	if th.BacklogAge <= 0 {
		th.BacklogAge = DefaultMaxBacklogAge
	}
	if th.TransactionAge <= 0 {
		th.TransactionAge = DefaultMaxTransactionAge
	}
	st := &Status{Problems: []string{}}
	for _, svc := range []string{Consumers, Workers} {
		s := ServiceStatus{Service: svc, Consumers: []ConsumerStatus{}}
		if err := outboxStatus(ctx, db, svc, &s); err != nil {
			s.Errors = append(s.Errors, "database: "+err.Error())
		}
		if rdb == nil {
			s.Errors = append(s.Errors, "redis: no --redis-url")
		} else if err := queueStatus(ctx, rdb, prefix, svc, &s); err != nil {
			s.Errors = append(s.Errors, "redis: "+err.Error())
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		for _, e := range s.Errors {
			st.Problems = append(st.Problems, fmt.Sprintf("%s: cannot read: %s", svc, e))
		}
		if s.OldestUnsentSeconds > th.BacklogAge.Seconds() {
			st.Problems = append(st.Problems, fmt.Sprintf("%s: oldest unsent outbox row is %.0f s old (threshold %v): is its relay running and Redis reachable?",
				svc, s.OldestUnsentSeconds, th.BacklogAge))
		}
		if s.Parked > 0 {
			st.Problems = append(st.Problems, fmt.Sprintf("%s: %d parked outbox row(s): see `outboxchat outbox parked --service %s`", svc, s.Parked, svc))
		}
		if s.DeadLetters > 0 {
			st.Problems = append(st.Problems, fmt.Sprintf("%s: %d dead letter(s) on %s: see `outboxchat deadletters list --service %s`", svc, s.DeadLetters, QueueName(Peer(svc)), svc))
		}
		st.Services = append(st.Services, s)
	}
	if err := db.QueryRow(ctx, horizonSQL).Scan(&st.Database.OldestXminAgeXids, &st.Database.OldestTransactionSeconds); err != nil {
		st.Database.Error = err.Error()
		st.Problems = append(st.Problems, "database: cannot read the cleanup horizon: "+err.Error())
	} else if st.Database.OldestTransactionSeconds > th.TransactionAge.Seconds() {
		st.Problems = append(st.Problems, fmt.Sprintf("database: a transaction or snapshot is %.0f s old (threshold %v): it holds back cleanup and slows the queue tables; find it in pg_stat_activity (xact_start) and end it",
			st.Database.OldestTransactionSeconds, th.TransactionAge))
	}
	st.Healthy = len(st.Problems) == 0
	return st, nil
}

// statusCacheTTL is the longest a gauge shows a snapshot before a scrape
// reads a new one: scrapes more often than this cost nothing.
const statusCacheTTL = 5 * time.Second

// statusCollector exports one service's part of the snapshot, read at most
// once per statusCacheTTL (by the scrape that finds it stale; 2 s bound):
//
//	outboxchat_outbox_unsent                 (relay role) rows not yet published, messages and receipts
//	outboxchat_outbox_oldest_unsent_seconds  (relay role) age of the oldest, database clock; 0 if none
//	outboxchat_outbox_parked                 (relay role) parked rows
//	outboxchat_queue_pending                 (worker role) pending entries of the service's consumer group
//	outboxchat_queue_lag                     (worker role) entries not yet delivered to the group
//	outboxchat_deadletter_entries            (worker role) length of the dead-letter stream
//
// A part that cannot be read is left out of that scrape.
type statusCollector struct {
	db                 outbox.DB // nil without the relay role
	rdb                redis.UniversalClient
	prefix, service    string
	unsent, oldest     *prometheus.Desc
	parked             *prometheus.Desc
	pending, lag, dead *prometheus.Desc

	mu            sync.Mutex
	at            time.Time
	s             ServiceStatus
	dbOK, redisOK bool
}

func newStatusCollector(db outbox.DB, rdb redis.UniversalClient, prefix, service string) *statusCollector {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }
	return &statusCollector{db: db, rdb: rdb, prefix: prefix, service: service,
		unsent:  d("outboxchat_outbox_unsent", "Outbox rows not yet published (messages and receipts), parked rows excluded."),
		oldest:  d("outboxchat_outbox_oldest_unsent_seconds", "Age of the oldest unsent outbox row by the database clock (0 if none)."),
		parked:  d("outboxchat_outbox_parked", "Parked outbox rows (publish failed --relay-max-attempts times); they wait for `outboxchat outbox retry`."),
		pending: d("outboxchat_queue_pending", "Entries delivered to this service's consumer group and not yet acknowledged."),
		lag:     d("outboxchat_queue_lag", "Entries of the stream not yet delivered to this service's consumer group."),
		dead:    d("outboxchat_deadletter_entries", "Entries in the dead-letter stream of the stream this service reads."),
	}
}

func (c *statusCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.unsent, c.oldest, c.parked, c.pending, c.lag, c.dead} {
		ch <- d
	}
}

func (c *statusCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.at) >= statusCacheTTL {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		s := ServiceStatus{Service: c.service}
		c.dbOK = c.db != nil && outboxStatus(ctx, c.db, c.service, &s) == nil
		c.redisOK = c.rdb != nil && queueStatus(ctx, c.rdb, c.prefix, c.service, &s) == nil
		cancel()
		c.s, c.at = s, time.Now()
	}
	g := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	if c.dbOK {
		g(c.unsent, float64(c.s.Unsent))
		g(c.oldest, c.s.OldestUnsentSeconds)
		g(c.parked, float64(c.s.Parked))
	}
	if c.redisOK {
		g(c.pending, float64(c.s.StreamPending))
		g(c.lag, float64(c.s.StreamLag))
		g(c.dead, float64(c.s.DeadLetters))
	}
}

// opsRelayEvents counts parked rows (outboxchat_relay_parked_total) and
// logs them as events, then hands every event to next.
func opsRelayEvents(reg prometheus.Registerer, next func(outbox.RelayEvent)) func(outbox.RelayEvent) {
	parked := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "outboxchat_relay_parked_total", Help: "Outbox rows parked after --relay-max-attempts failed publishes of their own.",
	})
	reg.MustRegister(parked)
	return func(e outbox.RelayEvent) {
		if e.Kind == outbox.EventParked {
			parked.Inc()
		}
		next(e)
	}
}

// opsQueueEvents counts dead letters dropped by the cap
// (outboxchat_deadletter_trimmed_total), then hands every event to next.
func opsQueueEvents(reg prometheus.Registerer, next func(redisq.Event)) func(redisq.Event) {
	trimmed := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "outboxchat_deadletter_trimmed_total", Help: "Dead-letter entries dropped (oldest first) to keep the stream at --dead-letter-max.",
	})
	reg.MustRegister(trimmed)
	return func(e redisq.Event) {
		if e.Kind == redisq.EventDeadLetterTrimmed {
			trimmed.Add(float64(e.N))
		}
		next(e)
	}
}
