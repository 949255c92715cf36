// Package metrics defines every Prometheus metric of a service process.
// The library reports typed events (outbox.RelayEvent, inbox.Event,
// redisq.Event) and hooks (store.SendMetrics, httpapi.SocketMetrics); the
// methods of Set register the metrics of one part each and return the hook
// that feeds them, and write the events worth a line as event log lines
// (chat.LogEvent), which the lab reads.
package metrics

import (
	"bufio"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/httpapi"
	"github.com/outboxchat/outboxchat/chat/receive"
	"github.com/outboxchat/outboxchat/chat/status"
	"github.com/outboxchat/outboxchat/chat/store"
	"github.com/outboxchat/outboxchat/chat/store/prune"
	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/outbox"
	"github.com/outboxchat/outboxchat/redisq"
)

// Set is a process's Prometheus registry and its metrics. Its methods
// register the metrics of one part each, once per process (a second call
// of one method panics: the registry refuses a name twice), and return the
// hook that feeds them; the hooks are safe for concurrent use.
type Set struct {
	reg *prometheus.Registry
	// selfCheckOK is outboxchat_listen_selfcheck_ok.
	selfCheckOK prometheus.Gauge
	// durability is outboxchat_redis_durable's snapshot (nil without
	// Redis); /readyz shows it too.
	durability *durabilityCollector
}

// Parts says which parts of a process New registers the metrics of.
type Parts struct {
	// Service is chat.Consumers or chat.Workers; RedisPrefix the prefix of
	// its Redis keys (the queue's part of the status snapshot).
	Service, RedisPrefix string
	// Listens: the process has the LISTEN connection
	// (outboxchat_listen_selfcheck_ok).
	Listens bool
	// Relay and Worker: the process runs the relay role (the outbox's part
	// of the status snapshot), the worker role (the queue's part).
	Relay, Worker bool
	// NATS, when set, is the connection of a queue on NATS JetStream (serve
	// --broker-url): the queue's part of the snapshot is read there
	// (status.NATSQueueStatus), not from Redis's streams, which such a
	// queue leaves empty. nil: the queue is Redis Streams.
	NATS *nats.Conn
}

// New registers on reg the metrics every process has: the Go runtime's and
// the process's, the database's cleanup horizon (read from pool at each
// scrape), the LISTEN self-check, the durability of each Redis node (rdb
// nil: none) and the process's part of the status snapshot (the outbox's
// where the relay runs, the queue's where the worker does).
func New(reg *prometheus.Registry, parts Parts, pool *pgxpool.Pool, rdb redis.UniversalClient) *Set {
	m := &Set{reg: reg, selfCheckOK: prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "outboxchat_listen_selfcheck_ok",
		Help: "1 when the latest start-up self-check's NOTIFY reached this process's LISTEN connection; 0 before it passed or when it failed (a transaction-mode pooler: set --listen-database-url).",
	})}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		newHorizonCollector(pool))
	if parts.Listens {
		reg.MustRegister(m.selfCheckOK)
	}
	if parts.Relay || parts.Worker {
		var db outbox.DB
		if parts.Relay {
			db = pool
		}
		var qr redis.UniversalClient
		var nc *nats.Conn
		if parts.Worker {
			qr, nc = rdb, parts.NATS
		}
		reg.MustRegister(newStatusCollector(db, qr, nc, parts.RedisPrefix, parts.Service))
	}
	if rdb != nil {
		m.durability = newDurabilityCollector(rdb)
		reg.MustRegister(m.durability)
	}
	return m
}

// Durability returns the durability of each Redis node the process talks
// to, at most statusCacheTTL old (the snapshot outboxchat_redis_durable
// exports), and false when the process has no Redis. Safe for concurrent
// use.
func (m *Set) Durability(ctx context.Context) ([]redisq.NodeDurability, bool) {
	if m.durability == nil {
		return nil, false
	}
	return m.durability.read(ctx), true
}

// durabilityCollector exports, per Redis node the process talks to, whether
// it keeps queued jobs through a restart and memory pressure, read at most
// once per statusCacheTTL (2 s bound; CONFIG GET, or INFO where CONFIG is
// refused):
//
//	outboxchat_redis_durable{node}   1: appendonly yes and maxmemory-policy noeviction; 0: not (jobs can be lost)
//
// A node whose settings cannot be read is left out of that scrape. The
// same snapshot feeds /readyz. Safe for concurrent use.
type durabilityCollector struct {
	rdb     redis.UniversalClient
	durable *prometheus.Desc

	mu    sync.Mutex
	at    time.Time
	nodes []redisq.NodeDurability
}

func newDurabilityCollector(rdb redis.UniversalClient) *durabilityCollector {
	return &durabilityCollector{rdb: rdb, durable: prometheus.NewDesc("outboxchat_redis_durable",
		"1 when the Redis node keeps queued jobs (appendonly yes, maxmemory-policy noeviction), 0 when a restart or memory pressure can lose them.",
		[]string{"node"}, nil)}
}

// read returns the nodes' settings, at most statusCacheTTL old.
func (c *durabilityCollector) read(ctx context.Context) []redisq.NodeDurability {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.nodes == nil || time.Since(c.at) >= statusCacheTTL {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		c.nodes, c.at = redisq.ReadDurability(ctx, c.rdb), time.Now()
		cancel()
	}
	return c.nodes
}

func (c *durabilityCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.durable }

func (c *durabilityCollector) Collect(ch chan<- prometheus.Metric) {
	for _, n := range c.read(context.Background()) {
		if !n.Known() {
			continue
		}
		v := 0.0
		if n.Durable() {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(c.durable, prometheus.GaugeValue, v, n.Addr)
	}
}

// Handler serves the registry (GET /metrics).
func (m *Set) Handler() http.Handler { return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}) }

// ListenReconnects exports the LISTEN connection's reconnects
// (notifier.Notifier.Reconnects).
func (m *Set) ListenReconnects(n func() int64) {
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "outboxchat_listen_reconnects_total",
		Help: "Times the process's LISTEN connection came back after it was lost or failed; each re-LISTENs every channel and runs a catch-up pass.",
	}, func() float64 { return float64(n()) }))
}

// SelfCheck records a LISTEN self-check's outcome.
func (m *Set) SelfCheck(ok bool) {
	if ok {
		m.selfCheckOK.Set(1)
	} else {
		m.selfCheckOK.Set(0)
	}
}

// Sends registers the send path's counters and returns the
// Store hook that feeds them:
//
//	outboxchat_sends_rejected_total{reason="lock_timeout"|"timeout"}
//	outboxchat_sends_replayed_total
//	outboxchat_send_commit_answers_lost_total{outcome="stored"|"not_stored"|"unknown"}
func (m *Set) Sends() *store.SendMetrics {
	reg := m.reg
	rejected := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "outboxchat_sends_rejected_total",
		Help: "Sends that failed on a timeout (nothing stored): lock_timeout = the chat's lock stayed busy, timeout = statement or transaction timeout.",
	}, []string{"reason"})
	replayed := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "outboxchat_sends_replayed_total",
		Help: "Sends answered with the message an earlier send with the same idempotency key stored (nothing stored).",
	})
	lost := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "outboxchat_send_commit_answers_lost_total",
		Help: "Send transactions whose COMMIT answer was lost (connection cut, terminated backend), by the outcome read after it: stored (answered as stored), not_stored (answered with the error), unknown (answered 503: retry with the same idempotency key).",
	}, []string{"outcome"})
	for _, r := range []string{"lock_timeout", "timeout"} {
		rejected.WithLabelValues(r) // export zeros
	}
	for _, o := range []string{"stored", "not_stored", "unknown"} {
		lost.WithLabelValues(o)
	}
	reg.MustRegister(rejected, replayed, lost)
	return &store.SendMetrics{
		Rejected:         func(reason string) { rejected.WithLabelValues(reason).Inc() },
		Replayed:         replayed.Inc,
		CommitAnswerLost: func(outcome string) { lost.WithLabelValues(outcome).Inc() },
	}
}

// Instrument wraps next (a ServeMux) and counts its requests by route
// pattern (the mux's, e.g. "POST /api/chats/{chat_id}/messages";
// "unmatched" for none) and status, with a latency histogram per route
// (WebSocket requests, which last as long as the connection, are counted
// but not timed):
//
//	outboxchat_http_requests_total{route, code}
//	outboxchat_http_request_duration_seconds{route}   0.5 ms … 8 s buckets
func (m *Set) Instrument(next http.Handler) http.Handler {
	reg := m.reg
	reqs := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "outboxchat_http_requests_total", Help: "HTTP requests by route pattern and status code.",
	}, []string{"route", "code"})
	dur := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "outboxchat_http_request_duration_seconds", Help: "HTTP request duration by route pattern (WebSocket connections excluded).",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 15),
	}, []string{"route"})
	reg.MustRegister(reqs, dur)
	// The vectors' children by route (and code), looked up once: nothing
	// deletes them, and WithLabelValues hashes its labels on every call.
	type routeCode struct {
		route string
		code  int
	}
	var counters, timers sync.Map // routeCode → Counter; route → Observer
	count := func(route string, code int) prometheus.Counter {
		k := routeCode{route, code}
		if c, ok := counters.Load(k); ok {
			return c.(prometheus.Counter)
		}
		c, _ := counters.LoadOrStore(k, reqs.WithLabelValues(route, strconv.Itoa(code)))
		return c.(prometheus.Counter)
	}
	timer := func(route string) prometheus.Observer {
		if o, ok := timers.Load(route); ok {
			return o.(prometheus.Observer)
		}
		o, _ := timers.LoadOrStore(route, dur.WithLabelValues(route))
		return o.(prometheus.Observer)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w}
		next.ServeHTTP(rec, r)
		route := r.Pattern // set by the ServeMux on r
		if route == "" {
			route = "unmatched"
		}
		code := rec.code
		switch {
		case rec.hijacked:
			code = http.StatusSwitchingProtocols
		case code == 0:
			code = http.StatusOK
		}
		count(route, code).Inc()
		if !rec.hijacked {
			timer(route).Observe(time.Since(start).Seconds())
		}
	})
}

// statusRecorder remembers the status code written through it; it passes
// Hijack (WebSocket) and Flush on, and Unwrap gives http.ResponseController
// the original.
type statusRecorder struct {
	http.ResponseWriter
	code     int
	hijacked bool
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.code == 0 {
		s.code = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.code == 0 {
		s.code = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (s *statusRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := s.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("chat: response writer cannot hijack")
	}
	c, rw, err := hj.Hijack()
	if err == nil {
		s.hijacked = true
	}
	return c, rw, err
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// horizonCollector exports, on each scrape, how far back the oldest
// transaction or snapshot the service's database can see holds the xmin
// horizon (while it is held, no dead row version younger than it
// can be cleaned up, and queue tables slow down):
//
//	outboxchat_db_oldest_xmin_age_xids     age() in transaction ids of the oldest backend_xid / backend_xmin
//	                                       in pg_stat_activity (this database), replication slot xmin and
//	                                       prepared transaction; visible to any role
//	outboxchat_db_oldest_transaction_seconds  now() − the oldest xact_start of a session holding an xid or
//	                                       snapshot; Postgres shows another role's xact_start only to
//	                                       superusers and pg_read_all_stats members, so without that the
//	                                       figure covers the service role's own sessions
//
// A failed query (2 s bound) exports nothing for that scrape.
type horizonCollector struct {
	pool              *pgxpool.Pool
	xidAge, xactStart *prometheus.Desc
}

func newHorizonCollector(pool *pgxpool.Pool) *horizonCollector {
	return &horizonCollector{
		pool: pool,
		xidAge: prometheus.NewDesc("outboxchat_db_oldest_xmin_age_xids",
			"Age in transaction ids of the oldest xmin holding back the database's cleanup horizon (backends, replication slots, prepared transactions).", nil, nil),
		xactStart: prometheus.NewDesc("outboxchat_db_oldest_transaction_seconds",
			"Age in seconds of the oldest transaction holding an xid or snapshot that this role may see in pg_stat_activity.", nil, nil),
	}
}

func (c *horizonCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.xidAge
	ch <- c.xactStart
}

func (c *horizonCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var xids, secs float64
	if err := c.pool.QueryRow(ctx, status.HorizonSQL).Scan(&xids, &secs); err != nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(c.xidAge, prometheus.GaugeValue, xids)
	ch <- prometheus.MustNewConstMetric(c.xactStart, prometheus.GaugeValue, secs)
}

// E2E registers the end-to-end histogram and returns the worker's
// observer, called with every committed inbox batch (inbox.Config.AfterCommit):
//
//	outboxchat_e2e_seconds   1 ms … 32.8 s buckets (×2)
//
// One observation per message recorded as new in this service's inbox:
// the inbox row's received_at minus the message's sent_at. Both are
// Postgres now() values on the one database the services share — the
// receiver's inbox transaction and the sender's send transaction, each
// taken when its transaction began, a statement before its commit — so
// the figure is sender commit → receiver inbox commit on the database
// clock, relay, Redis and worker included, with no host clock in it. The
// values come back from the insert the inbox batch runs anyway (no extra
// query); receipts, duplicates and dead letters are not observed. A
// message published again by the re-drive is observed from its first
// send. Safe for concurrent use.
func (m *Set) E2E() func([]inbox.Applied) {
	reg := m.reg
	h := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "outboxchat_e2e_seconds",
		Help:    "Sender commit to receiver inbox commit, database clock (inbox received_at − message sent_at), per message received.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
	})
	reg.MustRegister(h)
	return func(applied []inbox.Applied) {
		for _, a := range applied {
			if msg, ok := a.Value.(chat.Message); ok && msg.ReceivedAt != nil && !msg.SentAt.IsZero() {
				h.Observe(max(msg.ReceivedAt.Sub(msg.SentAt).Seconds(), 0))
			}
		}
	}
}

// Sockets registers the WebSocket metrics and returns the API's hooks that
// feed them:
//
//	outboxchat_ws_connections                   gauge: WebSockets open now (upgraded, not yet closed)
//	outboxchat_ws_evictions_total{reason}       sockets the server dropped: slow (fell a client buffer
//	                                            behind), write_timeout, ping_timeout
//	outboxchat_ws_frames_total{direction}       data frames: in (from clients), out (to clients)
//
// Labels carry no chat id.
func (m *Set) Sockets() httpapi.SocketMetrics {
	conns := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "outboxchat_ws_connections", Help: "WebSocket connections open now.",
	})
	evictions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "outboxchat_ws_evictions_total", Help: "WebSockets the server dropped, by reason (slow, write_timeout, ping_timeout).",
	}, []string{"reason"})
	frames := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "outboxchat_ws_frames_total", Help: "WebSocket data frames, by direction (in: from clients, out: to clients).",
	}, []string{"direction"})
	for _, r := range []string{"slow", "write_timeout", "ping_timeout"} {
		evictions.WithLabelValues(r) // export zeros
	}
	m.reg.MustRegister(conns, evictions, frames)
	return httpapi.SocketMetrics{
		Opened: conns.Inc, Closed: conns.Dec,
		Evicted: func(reason string) { evictions.WithLabelValues(reason).Inc() },
		FrameIn: frames.WithLabelValues("in").Inc, FrameOut: frames.WithLabelValues("out").Inc,
	}
}

// Refused registers outboxchat_http_refused_total{reason} and returns the
// guard's hook that counts its refusals.
func (m *Set) Refused() func(reason string) {
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "outboxchat_http_refused_total", Help: "Requests refused by the connection guard, by reason (host, origin, too_large, body_timeout, rate_ip, rate_user, sockets).",
	}, []string{"reason"})
	for _, r := range []string{"host", "origin", "too_large", "body_timeout", "rate_ip", "rate_user", "sockets"} {
		refused.WithLabelValues(r) // export zeros
	}
	m.reg.MustRegister(refused)
	return func(reason string) { refused.WithLabelValues(reason).Inc() }
}

// Subscribers registers outboxchat_ws_subscribers, read from n at each
// scrape (Gateway.Subscribers).
func (m *Set) Subscribers(n func() int) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "outboxchat_ws_subscribers", Help: "Live WebSocket subscribers.",
	}, func() float64 { return float64(n()) }))
}

// DeletedPending registers outboxchat_queue_deleted_pending_total, read
// from n at each scrape (redisq.Consumer.DeletedPending).
func (m *Set) DeletedPending(n func() int64) {
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "outboxchat_queue_deleted_pending_total",
		Help: "Pending stream entries found deleted from the stream (lost in Redis; healed by the sender's re-drive).",
	}, func() float64 { return float64(n()) }))
}

// SharedWork registers the counters of a group that shares transactions
// across partitions (outbox.RelayGroup, inbox.Group), read from stats at
// each scrape: name_transactions_total and name_<what>_total.
func (m *Set) SharedWork(name, what, help string, stats func() (txs, items int64)) {
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: name + "_transactions_total",
		Help: "Transactions " + help + " ran.",
	}, func() float64 { n, _ := stats(); return float64(n) }))
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: name + "_" + what + "_total",
		Help: "Partitions' " + what + " those transactions carried (more than the transactions: they were shared).",
	}, func() float64 { _, n := stats(); return float64(n) }))
}

// ConsumerNameShared registers outboxchat_consumer_name_shared, read from n
// at each scrape (the presence's Shared).
func (m *Set) ConsumerNameShared(n func() int64) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "outboxchat_consumer_name_shared",
		Help: "Other live processes consuming under this process's consumer name (they share one pending list); 0 when the name is this process's alone.",
	}, func() float64 { return float64(n()) }))
}

// Revoked registers outboxchat_auth_revoked, read from n at each scrape
// (the verifier's revocation set).
func (m *Set) Revoked(n func() int) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "outboxchat_auth_revoked",
		Help: "Users and token ids revoked (`outboxchat revoke`) that this API process refuses.",
	}, func() float64 { return float64(n()) }))
}

// Redriven registers outboxchat_redriven_total and returns the Redriver's
// hook that counts what each pass published.
func (m *Set) Redriven() func(n int) {
	redriven := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "outboxchat_redriven_total",
		Help: "Messages published again because no receipt came back within --redrive-after.",
	})
	m.reg.MustRegister(redriven)
	return func(n int) { redriven.Add(float64(n)) }
}

// Pruned registers outboxchat_history_pruned_rows_total{table} and returns
// the retention service's hook counting the rows it deleted.
func (m *Set) Pruned() func(table string, n int64) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "outboxchat_history_pruned_rows_total",
		Help: "History rows deleted by --history-retention, by table.",
	}, []string{"table"})
	for _, t := range prune.Tables {
		c.WithLabelValues(t)
	}
	m.reg.MustRegister(c)
	return func(table string, n int64) { c.WithLabelValues(table).Add(float64(n)) }
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
//	outboxchat_seq_lost                      (relay role) seqs published, then lost with commits the database lost (seq_lost)
//	outboxchat_queue_pending                 (worker role) pending entries of the service's consumer group
//	outboxchat_queue_lag                     (worker role) entries not yet delivered to the group
//	outboxchat_deadletter_entries            (worker role) length of the dead-letter stream
//
// The queue's three come from Redis's streams, or from JetStream's stream,
// durable consumer and dead-letter stream when the queue is on NATS. A
// part that cannot be read is left out of that scrape.
type statusCollector struct {
	db                 outbox.DB // nil without the relay role
	rdb                redis.UniversalClient
	nc                 *nats.Conn // the queue on NATS: read there, presence from rdb
	prefix, service    string
	unsent, oldest     *prometheus.Desc
	parked, lost       *prometheus.Desc
	pending, lag, dead *prometheus.Desc

	mu            sync.Mutex
	at            time.Time
	s             status.ServiceStatus
	dbOK, queueOK bool
}

func newStatusCollector(db outbox.DB, rdb redis.UniversalClient, nc *nats.Conn, prefix, service string) *statusCollector {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }
	return &statusCollector{db: db, rdb: rdb, nc: nc, prefix: prefix, service: service,
		unsent:  d("outboxchat_outbox_unsent", "Outbox rows not yet published (messages and receipts), parked rows excluded."),
		oldest:  d("outboxchat_outbox_oldest_unsent_seconds", "Age of the oldest unsent outbox row by the database clock (0 if none)."),
		parked:  d("outboxchat_outbox_parked", "Parked outbox rows (publish failed --relay-max-attempts times); they wait for `outboxchat outbox retry`."),
		lost:    d("outboxchat_seq_lost", "Seqs this service published whose messages its database lost with commits (a failover or restore; the seq fence's seq_lost): any is a message answered 201 and gone."),
		pending: d("outboxchat_queue_pending", "Entries delivered to this service's consumer group and not yet acknowledged."),
		lag:     d("outboxchat_queue_lag", "Entries of the stream not yet delivered to this service's consumer group."),
		dead:    d("outboxchat_deadletter_entries", "Entries in the dead-letter stream of the stream this service reads."),
	}
}

func (c *statusCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.unsent, c.oldest, c.parked, c.lost, c.pending, c.lag, c.dead} {
		ch <- d
	}
}

func (c *statusCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.at) >= statusCacheTTL {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		s := status.ServiceStatus{Service: c.service}
		c.dbOK = c.db != nil && status.OutboxStatus(ctx, c.db, c.service, &s) == nil
		if c.nc != nil {
			c.queueOK = status.NATSQueueStatus(ctx, c.nc, c.rdb, c.prefix, c.service, &s) == nil
		} else {
			c.queueOK = c.rdb != nil && status.QueueStatus(ctx, c.rdb, c.prefix, c.service, &s) == nil
		}
		cancel()
		c.s, c.at = s, time.Now()
	}
	g := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	if c.dbOK {
		g(c.unsent, float64(c.s.Unsent))
		g(c.oldest, c.s.OldestUnsentSeconds)
		g(c.parked, float64(c.s.Parked))
		g(c.lost, float64(c.s.LostSeqs))
	}
	if c.queueOK {
		g(c.pending, float64(c.s.StreamPending))
		g(c.lag, float64(c.s.StreamLag))
		g(c.dead, float64(c.s.DeadLetters))
	}
}

// RelayEvents registers the relay's metrics and returns its
// outbox.RelayConfig.OnEvent, which counts and times what it published,
// counts failed passes (logged as events) and parked rows, and tracks its
// LISTEN connection.
func (m *Set) RelayEvents(log *slog.Logger) func(outbox.RelayEvent) {
	reg := m.reg
	published := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "outboxchat_relay_published_total", Help: "Outbox rows published (and deleted from the outbox).",
	})
	passes := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "outboxchat_relay_pass_seconds", Help: "Duration of relay passes that published rows, claim to commit.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
	})
	failed := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "outboxchat_relay_failures_total", Help: "Failed relay passes (rows stay unsent) and LISTEN failures, by stage.",
	}, []string{"stage"})
	listening := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "outboxchat_relay_listening", Help: "1 while the relay's LISTEN connection is up.",
	})
	for _, stage := range []string{"claim", "publish", "mark_sent", "listen"} {
		failed.WithLabelValues(stage) // export zeros: alerts and the dashboard use the series
	}
	parked := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "outboxchat_relay_parked_total", Help: "Outbox rows parked after --relay-max-attempts failed publishes of their own.",
	})
	byTrigger := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "outboxchat_relay_published_by_trigger_total",
		Help: "Outbox rows published, by what started their pass: notify (a NOTIFY), wake (this process's own commit), catch_up (the LISTEN connection came back), poll (no wake-up for the poll interval), retry (a row's backoff ran out). Rows published on poll mean wake-ups are being missed.",
	}, []string{"trigger"})
	for _, t := range []outbox.WakeTrigger{outbox.TriggerNotify, outbox.TriggerWake, outbox.TriggerCatchUp, outbox.TriggerPoll, outbox.TriggerRetry} {
		byTrigger.WithLabelValues(string(t))
	}
	reg.MustRegister(published, passes, failed, listening, parked, byTrigger)
	return func(e outbox.RelayEvent) {
		switch e.Kind {
		case outbox.EventPublished:
			published.Add(float64(e.N))
			if e.Trigger != "" {
				byTrigger.WithLabelValues(string(e.Trigger)).Add(float64(e.N))
			}
			passes.Observe(e.Duration.Seconds())
		case outbox.EventPassFailed:
			failed.WithLabelValues(e.Stage).Inc()
			chat.LogEvent(log, slog.LevelInfo, string(e.Kind), "stage", e.Stage, "err", e.Err)
		case outbox.EventParked:
			parked.Inc()
		case outbox.EventListenUp:
			listening.Set(1)
		case outbox.EventListenDown:
			listening.Set(0)
			if e.Err != nil {
				failed.WithLabelValues("listen").Inc()
			}
		}
	}
}

// InboxEvents exports the inbox consumer's events as Prometheus metrics and
// logs duplicates and dead letters as events.
func (m *Set) InboxEvents(log *slog.Logger) func(inbox.Event) {
	reg := m.reg
	applied := prometheus.NewCounter(prometheus.CounterOpts{Name: "outboxchat_inbox_applied_total", Help: "Inbox deliveries by outcome."})
	dups := prometheus.NewCounter(prometheus.CounterOpts{Name: "outboxchat_inbox_duplicates_total", Help: "Inbox deliveries by outcome."})
	dead := prometheus.NewCounter(prometheus.CounterOpts{Name: "outboxchat_inbox_dead_lettered_total", Help: "Inbox deliveries by outcome."})
	// Of those dead-lettered, the messages whose (chat, seq) the inbox
	// already held under another message id (receive.ErrSeqConflict): the
	// sender handed a seq out twice. Alert on any increase.
	conflicts := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "outboxchat_inbox_seq_conflicts_total",
		Help: "Messages dead-lettered because their (chat, seq) was already stored under another message id.",
	})
	reg.MustRegister(applied, dups, dead, conflicts)
	return func(e inbox.Event) {
		switch e.Kind {
		case inbox.EventApplied:
			applied.Add(float64(e.N))
		case inbox.EventDuplicate:
			dups.Add(float64(e.N))
			chat.LogEvent(log, slog.LevelInfo, string(e.Kind), "message_id", e.MessageID, "ref", e.Ref)
		case inbox.EventDeadLettered:
			dead.Add(float64(e.N))
			if strings.Contains(e.Reason, receive.ErrSeqConflict.Error()+":") {
				conflicts.Add(float64(e.N))
			}
			chat.LogEvent(log, slog.LevelWarn, string(e.Kind), "message_id", e.MessageID, "ref", e.Ref, "reason", e.Reason)
		}
	}
}

// QueueEvents exports the queue consumer's reclaims and trims as Prometheus
// counters (outboxchat_queue_reclaimed_total, outboxchat_queue_trimmed_total,
// outboxchat_deadletter_trimmed_total)
// and logs the reclaims, the pending entries found deleted from the stream
// (one line per entry) and a lost consumer group as events.
func (m *Set) QueueEvents(log *slog.Logger, lock time.Duration) func(redisq.Event) {
	reg := m.reg
	reclaimed := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "outboxchat_queue_reclaimed_total", Help: "Stalled jobs taken over from another consumer after the lock duration.",
	})
	trimmed := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "outboxchat_queue_trimmed_total", Help: "Acknowledged entries trimmed from the stream this service reads.",
	})
	deadTrimmed := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "outboxchat_deadletter_trimmed_total", Help: "Dead-letter entries dropped (oldest first) to keep the stream at --dead-letter-max.",
	})
	reg.MustRegister(reclaimed, trimmed, deadTrimmed)
	return func(e redisq.Event) {
		switch e.Kind {
		case redisq.EventReclaimed:
			reclaimed.Add(float64(e.N))
			chat.LogEvent(log, slog.LevelInfo, string(e.Kind), "count", e.N, "lock_duration", lock)
		case redisq.EventDeadLetterTrimmed:
			deadTrimmed.Add(float64(e.N))
		case redisq.EventTrimmed:
			trimmed.Add(float64(e.N))
		case redisq.EventDeletedPending:
			for _, id := range e.StreamIDs {
				chat.LogEvent(log, slog.LevelWarn, string(e.Kind), "stream_id", id)
			}
		case redisq.EventGroupLost:
			chat.LogEvent(log, slog.LevelWarn, string(e.Kind), "err", e.Err)
		}
	}
}
