package chat

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxchat/outboxchat/inbox"
)

// sendMetrics registers the send path's counters on reg and returns the
// Store hook that feeds them:
//
//	outboxchat_sends_rejected_total{reason="lock_timeout"|"timeout"}
//	outboxchat_sends_replayed_total
func sendMetrics(reg *prometheus.Registry) *SendMetrics {
	rejected := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "outboxchat_sends_rejected_total",
		Help: "Sends that failed on a timeout (nothing stored): lock_timeout = the chat's lock stayed busy, timeout = statement or transaction timeout.",
	}, []string{"reason"})
	replayed := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "outboxchat_sends_replayed_total",
		Help: "Sends answered with the message an earlier send with the same idempotency key stored (nothing stored).",
	})
	for _, r := range []string{"lock_timeout", "timeout"} {
		rejected.WithLabelValues(r) // export zeros
	}
	reg.MustRegister(rejected, replayed)
	return &SendMetrics{
		Rejected: func(reason string) { rejected.WithLabelValues(reason).Inc() },
		Replayed: replayed.Inc,
	}
}

// httpMetrics wraps next (a ServeMux) and counts its requests by route
// pattern (the mux's, e.g. "POST /api/chats/{chat_id}/messages";
// "unmatched" for none) and status, with a latency histogram per route
// (WebSocket requests, which last as long as the connection, are counted
// but not timed):
//
//	outboxchat_http_requests_total{route, code}
//	outboxchat_http_request_duration_seconds{route}   0.5 ms … 8 s buckets
func httpMetrics(reg *prometheus.Registry, next http.Handler) http.Handler {
	reqs := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "outboxchat_http_requests_total", Help: "HTTP requests by route pattern and status code.",
	}, []string{"route", "code"})
	dur := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "outboxchat_http_request_duration_seconds", Help: "HTTP request duration by route pattern (WebSocket connections excluded).",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 15),
	}, []string{"route"})
	reg.MustRegister(reqs, dur)
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
		reqs.WithLabelValues(route, strconv.Itoa(code)).Inc()
		if !rec.hijacked {
			dur.WithLabelValues(route).Observe(time.Since(start).Seconds())
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
// horizon (issue 17: while it is held, no dead row version younger than it
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

// horizonSQL reads both figures (see horizonCollector).
const horizonSQL = `SELECT
	coalesce(greatest(
		(SELECT max(greatest(age(backend_xid), age(backend_xmin))) FROM pg_stat_activity
			WHERE datid = (SELECT oid FROM pg_database WHERE datname = current_database()) OR datid IS NULL),
		(SELECT max(greatest(age(xmin), age(catalog_xmin))) FROM pg_replication_slots),
		(SELECT max(age(transaction)) FROM pg_prepared_xacts)), 0)::float8,
	coalesce((SELECT extract(epoch FROM now() - min(xact_start)) FROM pg_stat_activity
		WHERE backend_xid IS NOT NULL OR backend_xmin IS NOT NULL), 0)::float8`

func (c *horizonCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.xidAge
	ch <- c.xactStart
}

func (c *horizonCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var xids, secs float64
	if err := c.pool.QueryRow(ctx, horizonSQL).Scan(&xids, &secs); err != nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(c.xidAge, prometheus.GaugeValue, xids)
	ch <- prometheus.MustNewConstMetric(c.xactStart, prometheus.GaugeValue, secs)
}

// e2eMetric registers the end-to-end histogram and returns the worker's
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
func e2eMetric(reg prometheus.Registerer) func([]inbox.Applied) {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "outboxchat_e2e_seconds",
		Help:    "Sender commit to receiver inbox commit, database clock (inbox received_at − message sent_at), per message received.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
	})
	reg.MustRegister(h)
	return func(applied []inbox.Applied) {
		for _, a := range applied {
			if m, ok := a.Value.(Message); ok && m.ReceivedAt != nil && !m.SentAt.IsZero() {
				h.Observe(max(m.ReceivedAt.Sub(m.SentAt).Seconds(), 0))
			}
		}
	}
}

// wsMetrics are the WebSocket gateway's metrics, registered by
// newWSMetrics:
//
//	outboxchat_ws_connections                   gauge: WebSockets open now (upgraded, not yet closed)
//	outboxchat_ws_evictions_total{reason}       sockets the server dropped: slow (fell a client buffer
//	                                            behind), write_timeout, ping_timeout
//	outboxchat_ws_frames_total{direction}       data frames: in (from clients), out (to clients)
//
// Labels carry no chat id. The methods are safe for concurrent use; a nil
// *wsMetrics counts nothing.
type wsMetrics struct {
	conns               prometheus.Gauge
	evictions           *prometheus.CounterVec
	framesIn, framesOut prometheus.Counter
}

func newWSMetrics(reg prometheus.Registerer) *wsMetrics {
	m := &wsMetrics{
		conns: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outboxchat_ws_connections", Help: "WebSocket connections open now.",
		}),
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxchat_ws_evictions_total", Help: "WebSockets the server dropped, by reason (slow, write_timeout, ping_timeout).",
		}, []string{"reason"}),
	}
	frames := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "outboxchat_ws_frames_total", Help: "WebSocket data frames, by direction (in: from clients, out: to clients).",
	}, []string{"direction"})
	m.framesIn, m.framesOut = frames.WithLabelValues("in"), frames.WithLabelValues("out")
	for _, r := range []string{"slow", "write_timeout", "ping_timeout"} {
		m.evictions.WithLabelValues(r) // export zeros
	}
	reg.MustRegister(m.conns, m.evictions, frames)
	return m
}

func (m *wsMetrics) opened() {
	if m != nil {
		m.conns.Inc()
	}
}

func (m *wsMetrics) closed() {
	if m != nil {
		m.conns.Dec()
	}
}

func (m *wsMetrics) evicted(reason string) {
	if m != nil {
		m.evictions.WithLabelValues(reason).Inc()
	}
}

func (m *wsMetrics) frameIn() {
	if m != nil {
		m.framesIn.Inc()
	}
}

func (m *wsMetrics) frameOut() {
	if m != nil {
		m.framesOut.Inc()
	}
}
