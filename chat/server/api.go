package server

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/gateway"
	"github.com/outboxchat/outboxchat/chat/httpapi"
	"github.com/outboxchat/outboxchat/chat/live"
	"github.com/outboxchat/outboxchat/chat/server/internal/revocations"
	"github.com/outboxchat/outboxchat/chat/server/internal/tracing"
	"github.com/outboxchat/outboxchat/chat/store"
	"github.com/outboxchat/outboxchat/outbox"
	"github.com/outboxchat/outboxchat/redisq"

	"github.com/redis/go-redis/v9"
)

// maxHeaderBytes bounds a request's headers (net/http's default is 1 MiB;
// a JWT and a few headers need a few KiB).
const maxHeaderBytes = 64 << 10

// notifyInterval spaces the post-commit NOTIFYs of a process whose own
// relay is woken directly (outbox.WriterConfig.NotifyInterval).
const notifyInterval = 5 * time.Millisecond

// buildAPI builds the api role after the gateway: the outbox writer, the
// send path, the HTTP API and its server.
func (p *process) buildAPI() error {
	c := p.cfg
	if p.verifier != nil {
		// Before the HTTP server: its first read is done before a request
		// is served.
		p.add(revocations.New(p.pool, c.Service, p.verifier.Revocations(), p.log))
		p.m.Revoked(p.verifier.Revocations().Len)
	}
	// One writer per partition's outbox (chat.OutboxTable); a send goes
	// to its chat's.
	writers := make([]*outbox.Writer, c.Partitions)
	var interval time.Duration
	if c.directRelayWake() {
		// The relay of this process is woken directly (below); the NOTIFY
		// only wakes other processes' relays and gateways, which can wait a
		// few milliseconds under load.
		interval = notifyInterval
	}
	var notifier *outbox.Notifier
	if c.Partitions > 1 && c.API.Wake == outbox.WakeAfterCommit {
		// One statement wakes the channels of every partition a send
		// group touched, instead of one per partition.
		var err error
		if notifier, err = outbox.NewNotifier(p.pool, &outbox.NotifierConfig{Interval: interval, Logger: p.log}); err != nil {
			return err
		}
		p.add(notifier)
	}
	for part := range writers {
		wcfg := &outbox.WriterConfig{
			Table: chat.OutboxTable(c.Service, part), Channel: chat.PartitionOutboxChannel(c.Service, part),
			Mode: c.API.Wake, Logger: p.log, NotifyInterval: interval, Notifier: notifier,
		}
		var err error
		if writers[part], err = outbox.NewWriter(p.pool, wcfg); err != nil {
			return err
		}
	}
	gw := p.gw
	afterCommit := func(ms []chat.Message) { gw.Offer(false, ms) }
	if wake := p.relayWakeChats; wake != nil && c.directRelayWake() {
		// In the after-commit mode the relays in this process are woken
		// directly, a round trip sooner than through their LISTEN; the
		// NOTIFY still wakes relays elsewhere. The other modes are left to
		// measure what they are (in-tx NOTIFY, poll only).
		afterCommit = func(ms []chat.Message) { wake(ms); gw.Offer(false, ms) }
	}
	var afterEvent func(int64)
	if wake := p.relayWake; wake != nil && c.directRelayWake() {
		// Edits, deletes and read marks too: this process's relay skips
		// the NOTIFY they send, as it does a send's.
		afterEvent = func(chatID int64) { wake(chat.Partition(chatID, c.Partitions)) }
	}
	scfg := &store.Config{
		Service: c.Service, Writers: writers, LockTimeout: c.API.SendLockTimeout, ReadTimeout: c.API.ReadTimeout,
		Metrics: p.m.Sends(), Logger: p.log, AfterCommit: afterCommit, AfterEvent: afterEvent,
	}
	if p.tracer.Enabled() {
		scfg.Headers, scfg.OnBatch = p.tracer.Inject, tracing.SendTx(p.tracer)
	}
	st, err := store.New(p.pool, scfg)
	if err != nil {
		return err
	}
	for _, w := range writers {
		p.add(w)
	}
	p.add(gw, st)
	var sender httpapi.Sender = st
	if c.Mode == ModeDualWrite {
		var pub store.Adder
		if p.nc != nil {
			q, err := p.natsQueue(c.Service, 0, p.signer())
			if err != nil {
				return err
			}
			pub = natsAdder{q}
		} else if pub, err = redisq.NewPublisher(p.rdb, p.publisherConfig(0)); err != nil {
			return err
		}
		dw := store.NewDualWriter(st, pub, p.log)
		p.add(dw)
		sender = dualWriteSender{dw}
	}
	deps := httpapi.Deps{Sender: sender, Reader: st, Rooms: rooms{gw}, Browser: st, Changer: st}
	if hub, err := p.buildLive(); err != nil {
		return err
	} else if hub != nil {
		deps.Live = liveRooms{hub}
	}
	if p.tracer.Enabled() {
		deps.Sender = tracing.Sender(deps.Sender)
	}
	api, err := httpapi.New(deps, &httpapi.Config{
		Service: c.Service, ListenAddr: c.API.HTTPAddr, MaxBodyBytes: c.API.MaxBodyBytes, Verifier: p.verifier,
		Guard: c.API.Guard, Refused: p.m.Refused(), Sockets: p.m.Sockets(), Logger: p.log,
	})
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	return p.buildHTTP(api)
}

// buildHTTP builds the HTTP server of the api role: the API's routes,
// /metrics, /healthz and /readyz, behind the API's middleware.
func (p *process) buildHTTP(api *httpapi.API) error {
	c := p.cfg
	var tlsConfig *tls.Config
	if c.API.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.API.TLSCertFile, c.API.TLSKeyFile)
		if err != nil {
			return fmt.Errorf("serve: tls: %w", err)
		}
		tlsConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	hs := &httpService{api: api, log: p.log, stopping: new(atomic.Bool), delay: c.API.ShutdownDelay, tls: tlsConfig != nil}
	mux := http.NewServeMux()
	api.Register(mux)
	mux.Handle("GET /metrics", p.m.Handler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", p.readyz(hs.stopping))
	ln, err := net.Listen("tcp", c.API.HTTPAddr)
	if err != nil {
		return fmt.Errorf("serve: listen %s: %w", c.API.HTTPAddr, err)
	}
	if tlsConfig != nil {
		ln = tls.NewListener(ln, tlsConfig)
	}
	readHeader, idle := api.Timeouts()
	hs.ln = ln
	handler := api.Handler(mux, p.m.Instrument)
	if p.tracer.Enabled() {
		handler = tracing.HTTPSend(p.tracer, handler)
	}
	hs.srv = &http.Server{Handler: handler, ReadHeaderTimeout: readHeader, IdleTimeout: idle,
		MaxHeaderBytes: maxHeaderBytes,
		// Failed TLS handshakes and the like: every scanner causes them.
		ErrorLog: slog.NewLogLogger(p.log.Handler(), slog.LevelDebug)}
	p.http = hs
	p.add(hs)
	return nil
}

// readyz answers GET /readyz: 503 while stopping, or when the database,
// (for the roles that need it) Redis, or the NATS server of a queue on
// JetStream (Config.BrokerURL) cannot be reached, saying which and why; 200 {"status": "ready"} otherwise. A Redis that is up but not
// durable keeps the process ready (it works; restarting it would not
// help) and is named: "redis_durable": false and a "warnings" list.
func (p *process) readyz(stopping *atomic.Bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if stopping.Load() {
			httpapi.WriteJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "stopping", "error": "service stopping", "field": ""})
			return
		}
		pctx, cancel := context.WithTimeout(r.Context(), time.Second)
		defer cancel()
		if err := p.pool.Ping(pctx); err != nil {
			p.log.Warn("readyz: database unreachable", "err", err)
			httpapi.WriteJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "database unavailable", "error": "database unavailable", "field": ""})
			return
		}
		// The roles that need Redis (relay, worker; the v1 API) cannot do
		// their work without it: not ready, and say which and why.
		if p.rdb != nil {
			if err := p.rdb.Ping(pctx).Err(); err != nil {
				httpapi.WriteJSON(w, http.StatusServiceUnavailable, map[string]string{
					"status": "redis unavailable", "roles": strings.Join(p.cfg.redisRoles(), ","), "error": err.Error(),
				})
				return
			}
		}
		// The queue on NATS: the relay and the worker wait for it.
		if p.nc != nil && !p.nc.IsConnected() {
			httpapi.WriteJSON(w, http.StatusServiceUnavailable, map[string]string{
				"status": "broker unavailable", "roles": strings.Join(p.cfg.redisRoles(), ","), "error": "nats: " + p.nc.Status().String(),
			})
			return
		}
		body := map[string]any{"status": "ready"}
		if nodes, ok := p.m.Durability(pctx); ok {
			durable, warnings := true, []string{}
			for _, n := range nodes {
				if msg := n.Problem(); msg != "" {
					durable = false
					warnings = append(warnings, "redis "+n.Addr+" is NOT DURABLE: "+msg)
				}
			}
			body["redis_durable"], body["warnings"] = durable, warnings
		}
		httpapi.WriteJSON(w, http.StatusOK, body)
	}
}

// buildLive builds the typing and presence hub (package live) on the
// process's Redis client, or on one of its own when no other role needs
// Redis: nil without a Redis URL (no typing, no presence). It never needs
// Redis up: sends do not depend on it.
func (p *process) buildLive() (*live.Hub, error) {
	c := p.cfg
	if c.RedisURL == "" {
		return nil, nil
	}
	var rdb redis.UniversalClient = p.rdb
	if p.rdb == nil {
		own, err := redisq.NewClient(c.RedisURL)
		if err != nil {
			p.log.Warn("typing and presence off: the Redis URL is not one they can use", "err", err)
			return nil, nil
		}
		rdb = own
		p.add(closer{own})
	}
	hub, err := live.New(rdb, &live.Config{Service: c.Service, Prefix: c.RedisPrefix, Logger: p.log})
	if err != nil {
		return nil, err
	}
	p.add(hub)
	return hub, nil
}

// closer closes a Redis client when stopped (services stop in reverse
// order: after the hub that uses it).
type closer struct{ c redis.UniversalClient }

func (closer) Start(context.Context) error  { return nil }
func (c closer) Stop(context.Context) error { return c.c.Close() }

// liveRooms adapts the live hub to httpapi.Live.
type liveRooms struct{ h *live.Hub }

func (l liveRooms) Join(chatID int64, author string) (<-chan []byte, func(), func()) {
	m := l.h.Join(chatID, author)
	return m.C, m.Typing, m.Leave
}

// rooms adapts the gateway to httpapi.Rooms.
type rooms struct{ g *gateway.Gateway }

var _ httpapi.Rooms = rooms{}

func (r rooms) Follow(chatID, afterSent, afterReceived int64) (<-chan []byte, <-chan struct{}, func()) {
	s := r.g.Subscribe(chatID, afterSent, afterReceived)
	return s.C, s.Evicted, s.Close
}

// dualWriteSender adapts the v1 dual writer to httpapi.Sender: it has no
// idempotency keys (the write-up's v1 had none), so key is ignored.
type dualWriteSender struct{ dw *store.DualWriter }

var _ httpapi.Sender = dualWriteSender{}

func (d dualWriteSender) SendIdempotent(ctx context.Context, chatID int64, body, _, author string) (chat.Message, bool, error) {
	m, err := d.dw.Send(ctx, chatID, body, author)
	return m, false, err
}
