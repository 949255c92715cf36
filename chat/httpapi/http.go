package httpapi

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/auth"
	"github.com/outboxchat/outboxchat/chat/httpapi/internal/openapi"
	"github.com/outboxchat/outboxchat/chat/web"

	"github.com/coder/websocket"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxchat/outboxchat/inbox"
)

// HTTP defaults.
const (
	DefaultHistoryLimit = 1000
	maxHistoryLimit     = 10000
	wsWriteTimeout      = 5 * time.Second
)

// API serves one service's HTTP endpoints:
//
//	POST /api/chats/{chat_id}/messages   {"body": "...", "client_id": "..."} → 201 Message
//	     (Idempotency-Key header or client_id: a repeat → 200 the first Message, another body → 409)
//	GET  /api/chats/{chat_id}/messages?after_seq=N[&after_consumers=N&after_workers=N][&limit=N]
//	     → 200 {"messages": [Message…], "more": bool}
//	GET  /ws?chat_id=ID[&after_consumers=N&after_workers=N]   WebSocket: pushes Message frames
//
// Bad input gets 400 {"error": "...", "field": "..."}; nothing is stored. A
// database that cannot be reached, a chat whose lock stays busy past the
// lock timeout and a read past the read timeout get 503 with a short generic
// error (nothing half-written: the send transaction rolled back); the cause
// is logged, never put in a body. API is safe for concurrent use.
type API struct {
	deps    Deps
	service string
	maxBody int
	log     *slog.Logger
	// verifier checks bearer tokens (package auth); nil when auth is off.
	verifier *auth.Verifier
	// guard bounds what one client can take (guard.go).
	guard *guard
	// ws counts connections, evictions and frames.
	ws SocketMetrics
	// closing is closed when the service stops: every WebSocket is closed
	// with StatusGoingAway so clients reconnect (http.Server.Shutdown does
	// not track hijacked connections). sockets counts the live handlers.
	closing   chan struct{}
	closeOnce sync.Once
	sockets   sync.WaitGroup
}

// Sender stores a message: the send path (store.Store, or the lab's v1
// dual writer). key is the idempotency key ("" for none), author the
// principal's user ("" with auth off); replayed is true when an earlier
// send with the same key stored the message returned. Errors: a
// *chat.FieldError (wrapped) for bad input, ErrIdempotencyConflict,
// ErrChatBusy (wrapped), anything else is a 503.
type Sender interface {
	SendIdempotent(ctx context.Context, chatID int64, body, key, author string) (m chat.Message, replayed bool, err error)
}

// Reader reads a chat as this service sees it: a page of history after the
// given cursors, each list at most limit long (errors past the read timeout
// wrap ErrReadTimeout), and the highest of this service's seqs that the
// other side's receipts cover, with its time (0 for none).
type Reader interface {
	History(ctx context.Context, chatID, afterSent, afterReceived int64, limit int) (chat.History, error)
	DeliveredUpTo(ctx context.Context, chatID int64) (int64, time.Time, error)
}

// Rooms lets a WebSocket follow a chat live from the given cursors: frames
// (JSON) arrive on frames in order; evicted is closed when the subscriber
// fell too far behind; cancel unsubscribes (idempotent).
type Rooms interface {
	Follow(chatID, afterSent, afterReceived int64) (frames <-chan []byte, evicted <-chan struct{}, cancel func())
}

// Deps are the parts the API serves from. Sender, Reader and Rooms are
// required; without Browser and Changer their routes answer 501, without
// Live the WebSocket has no typing or presence.
type Deps struct {
	Sender  Sender
	Reader  Reader
	Rooms   Rooms
	Browser Browser
	Changer Changer
	Live    Live
}

// SocketMetrics receives WebSocket events, e.g. to feed Prometheus. Every
// field is optional; set ones must be cheap, non-blocking and safe for
// concurrent use.
type SocketMetrics struct {
	// Opened and Closed are called once per upgraded WebSocket.
	Opened, Closed func()
	// Evicted is called when the server drops a socket: reason "slow",
	// "write_timeout" or "ping_timeout".
	Evicted func(reason string)
	// FrameIn and FrameOut are called per frame read and written.
	FrameIn, FrameOut func()
}

func (m SocketMetrics) opened() {
	if m.Opened != nil {
		m.Opened()
	}
}

func (m SocketMetrics) closed() {
	if m.Closed != nil {
		m.Closed()
	}
}

func (m SocketMetrics) evicted(reason string) {
	if m.Evicted != nil {
		m.Evicted(reason)
	}
}

func (m SocketMetrics) frameIn() {
	if m.FrameIn != nil {
		m.FrameIn()
	}
}

func (m SocketMetrics) frameOut() {
	if m.FrameOut != nil {
		m.FrameOut()
	}
}

// Config configures an API. Service and ListenAddr are required; a zero
// field means its default.
type Config struct {
	// Service is chat.Consumers or chat.Workers.
	Service string
	// ListenAddr is the server's listen address: the default host
	// allow-list is its host plus localhost (GuardConfig.AllowedHosts).
	ListenAddr string
	// MaxBodyBytes limits a message body. Default chat.DefaultMaxBodyBytes.
	MaxBodyBytes int
	// Verifier checks bearer tokens; nil means auth is off (every request
	// passes).
	Verifier *auth.Verifier
	// Guard bounds what one client can take (GuardConfig's defaults apply
	// to its zero fields).
	Guard GuardConfig
	// Refused, when set, is called once per request the guard refuses,
	// with the reason (host, origin, too_large, body_timeout, rate_ip,
	// rate_user, sockets). It must not block.
	Refused func(reason string)
	// Sockets receives WebSocket events.
	Sockets SocketMetrics
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// New returns the API of one service, serving from deps as configured by
// cfg. Errors: an unknown service, a missing dependency, or a guard
// setting that does not parse (an allowed host or origin).
func New(deps Deps, cfg *Config) (*API, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	if err := chat.CheckService(cfg.Service); err != nil {
		return nil, err
	}
	if deps.Sender == nil || deps.Reader == nil || deps.Rooms == nil {
		return nil, errors.New("httpapi: New needs a Sender, a Reader and Rooms")
	}
	log := cmp.Or(cfg.Logger, slog.Default())
	maxBody := cmp.Or(cfg.MaxBodyBytes, chat.DefaultMaxBodyBytes)
	g, err := newGuard(cfg.Guard, cfg.ListenAddr, int64(maxBody)*6+1024, cfg.Refused, log)
	if err != nil {
		return nil, err
	}
	return &API{deps: deps, service: cfg.Service, maxBody: maxBody, log: log, verifier: cfg.Verifier,
		guard: g, ws: cfg.Sockets, closing: make(chan struct{})}, nil
}

// Timeouts returns the guard's ReadHeaderTimeout and IdleTimeout, with
// their defaults applied, for the http.Server in front of the API.
func (a *API) Timeouts() (readHeader, idle time.Duration) {
	return a.guard.cfg.ReadHeaderTimeout, a.guard.cfg.IdleTimeout
}

// Handler wraps next (the server's mux, on which Register was called) in
// the API's middleware, outermost first: connection checks (host, origin,
// per-IP rate, body size and deadline), the bearer token, the per-user
// rate, then instrument (nil: none), then JSON errors for the mux's own
// 404 and 405 answers.
func (a *API) Handler(next *http.ServeMux, instrument func(http.Handler) http.Handler) http.Handler {
	var h http.Handler = withJSONErrors(next)
	if instrument != nil {
		h = instrument(h)
	}
	return a.guard.wrap(authenticate(a.verifier, a.guard.limitUsers(h)))
}

// CloseSockets closes every WebSocket with 1001 (going away) and waits for
// their handlers, at most until ctx ends (then an error wrapping
// ctx.Err()). Call it when the service stops, after the server stopped
// taking requests; later calls only wait.
func (a *API) CloseSockets(ctx context.Context) error {
	a.closeOnce.Do(func() { close(a.closing) })
	if err := waitGroupCtx(ctx, &a.sockets); err != nil {
		return fmt.Errorf("close websockets: %w", err)
	}
	return nil
}

// waitGroupCtx waits for wg, at most until ctx ends (then ctx.Err()).
func waitGroupCtx(ctx context.Context, wg *sync.WaitGroup) error {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Register adds the API's routes to mux: the messages endpoints, the
// WebSocket, GET /openapi.json and the chat page at GET /.
func (a *API) Register(mux *http.ServeMux) {
	mux.HandleFunc("POST /api/chats/{chat_id}/messages", a.handleSend)
	mux.HandleFunc("GET /api/chats/{chat_id}/messages", a.handleHistory)
	mux.HandleFunc("PATCH /api/chats/{chat_id}/messages/{message_id}", a.handleEdit)
	mux.HandleFunc("DELETE /api/chats/{chat_id}/messages/{message_id}", a.handleDelete)
	mux.HandleFunc("POST /api/chats/{chat_id}/read", a.handleRead)
	mux.HandleFunc("GET /api/chats", a.handleChats)
	mux.HandleFunc("GET /ws", a.handleWS)
	mux.HandleFunc("GET /openapi.json", openapi.Serve)
	mux.Handle("GET /{$}", web.Handler(a.service))
	mux.Handle("GET /favicon.svg", web.Favicon())
	mux.Handle("GET /favicon.ico", web.Favicon())
}

// ErrorBody is every error answer (JSON): {"error": "...", "field": "..."}; field
// is "" when the error is not about one field.
type ErrorBody struct {
	Error string `json:"error"`
	Field string `json:"field"`
}

// WriteJSON answers with status code and v as JSON.
func WriteJSON(w http.ResponseWriter, code int, v any) {
	writeJSON(w, code, v)
}

// answerBufs holds writeJSON's buffers for a chat.Message (*[]byte);
// those grown past maxPooledAnswer (a long body) are left to the GC.
var answerBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

const maxPooledAnswer = 8 << 10

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	if m, ok := v.(chat.Message); ok {
		// The send's answer: the bytes an Encoder gives, without its
		// reflection and its re-scan of MarshalJSON's output. The
		// ResponseWriter copies them, so the buffer goes back to the pool.
		bp := answerBufs.Get().(*[]byte)
		*bp = append(m.AppendJSON((*bp)[:0]), '\n')
		_, _ = w.Write(*bp)
		if cap(*bp) <= maxPooledAnswer {
			answerBufs.Put(bp)
		}
		return
	}
	_ = json.NewEncoder(w).Encode(v)
}

// writeError answers a *FieldError with 400 and anything else with a
// generic 503 (the caller logs the cause).
func writeError(w http.ResponseWriter, err error) {
	var fe *chat.FieldError
	if errors.As(err, &fe) {
		writeJSON(w, http.StatusBadRequest, ErrorBody{Error: fe.Error(), Field: fe.Field})
		return
	}
	writeJSON(w, http.StatusServiceUnavailable, ErrorBody{Error: "database unavailable, try again"})
}

// idempotencyKey returns the send's idempotency key: the Idempotency-Key
// header or the body's client_id (they must agree when both are given),
// "" for none, and the name of the field it came from.
func idempotencyKey(r *http.Request, req chat.SendRequest) (key, field string, err error) {
	hs, ok := r.Header["Idempotency-Key"]
	if !ok {
		return req.ClientID, "client_id", nil
	}
	if len(hs) > 1 {
		return "", "", &chat.FieldError{Field: "Idempotency-Key", Msg: "given twice"}
	}
	if err := chat.ValidateClientID("Idempotency-Key", hs[0]); err != nil {
		return "", "", err
	}
	if req.ClientID != "" && req.ClientID != hs[0] {
		return "", "", &chat.FieldError{Field: "client_id", Msg: "differs from the Idempotency-Key header"}
	}
	return hs[0], "Idempotency-Key", nil
}

func (a *API) handleSend(w http.ResponseWriter, r *http.Request) {
	chatID, err := chat.ParseChatID(r.PathValue("chat_id"))
	if err != nil {
		writeError(w, err)
		return
	}
	// JSON only: a form or text/plain POST from another site's page (a
	// "simple" cross-origin request, no preflight) is refused.
	if ct := r.Header.Get("Content-Type"); ct != "application/json" && !isJSONMediaType(ct) {
		writeJSON(w, http.StatusUnsupportedMediaType, ErrorBody{Error: "Content-Type must be application/json", Field: "Content-Type"})
		return
	}
	// Read at most the body limit plus room for JSON escaping and the key.
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(a.maxBody)*6+1024))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeJSON(w, http.StatusRequestEntityTooLarge, ErrorBody{Error: fmt.Sprintf("request over %d bytes", mbe.Limit), Field: "body"})
			return
		}
		bodyUnreadable(w, err)
		return
	}
	req, err := chat.DecodeSendRequest(data, a.maxBody)
	if err != nil {
		writeError(w, err)
		return
	}
	key, keyField, err := idempotencyKey(r, req)
	if err != nil {
		writeError(w, err)
		return
	}
	m, replayed, err := a.send(r.Context(), chatID, req.Body, key)
	if err != nil {
		a.sendFailed(w, chatID, keyField, err)
		return
	}
	if replayed {
		writeJSON(w, http.StatusOK, m)
		return
	}
	writeJSON(w, http.StatusCreated, m)
}

// isJSONMediaType reports whether Content-Type value ct parses as a media
// type and names application/json (parameters such as charset allowed).
func isJSONMediaType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "application/json"
}

// send stores a message through the Sender, as the request's principal.
func (a *API) send(ctx context.Context, chatID int64, body, key string) (chat.Message, bool, error) {
	return a.deps.Sender.SendIdempotent(ctx, chatID, body, key, auth.AuthorOf(ctx))
}

// sendError maps a failed send to its status and body: 400 for bad input,
// 409 for a reused idempotency key (keyField names where the key came
// from), 503 otherwise, with a short generic text (never the cause).
func sendError(err error, keyField string) (int, ErrorBody) {
	var fe *chat.FieldError
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &fe):
		return http.StatusBadRequest, ErrorBody{Error: fe.Error(), Field: fe.Field}
	case errors.Is(err, chat.ErrIdempotencyConflict):
		return http.StatusConflict, ErrorBody{Error: "this idempotency key was already used for another message in this chat", Field: keyField}
	case inbox.IsPermanent(err) && errors.As(err, &pgErr):
		// Input the validator let through but the database refused (a
		// data exception or constraint violation, SQLSTATE class 22 or 23).
		return http.StatusBadRequest, ErrorBody{Error: "the database refused the message", Field: "body"}
	case errors.Is(err, chat.ErrChatBusy):
		return http.StatusServiceUnavailable, ErrorBody{Error: "chat busy, nothing was stored; retry later with the same idempotency key"}
	case errors.Is(err, chat.ErrSendOutcomeUnknown):
		return http.StatusServiceUnavailable, ErrorBody{Error: "the database connection failed as the message was committed: it may be stored; retry with the same idempotency key to know"}
	}
	return http.StatusServiceUnavailable, ErrorBody{Error: "could not store the message; retry with the same idempotency key"}
}

func (a *API) sendFailed(w http.ResponseWriter, chatID int64, keyField string, err error) {
	code, body := sendError(err, keyField)
	if code == http.StatusServiceUnavailable {
		a.log.Warn("send failed", "chat_id", chatID, "err", err)
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, code, body)
}

// cursors reads after_seq (both origins), after_consumers and after_workers
// and returns (own, other).
func (a *API) cursors(r *http.Request) (own, other int64, err error) {
	q := r.URL.Query()
	base, err := chat.ParseSeq("after_seq", q.Get("after_seq"))
	if err != nil {
		return 0, 0, err
	}
	by := map[string]int64{chat.Consumers: base, chat.Workers: base}
	for _, s := range []string{chat.Consumers, chat.Workers} {
		if v := q.Get("after_" + s); v != "" {
			if by[s], err = chat.ParseSeq("after_"+s, v); err != nil {
				return 0, 0, err
			}
		}
	}
	return by[a.service], by[chat.Peer(a.service)], nil
}

// room parses a chat id (raw) and the request's cursors; on bad input it
// writes the 400 and reports ok false.
func (a *API) room(w http.ResponseWriter, r *http.Request, raw string) (chatID, own, other int64, ok bool) {
	chatID, err := chat.ParseChatID(raw)
	if err == nil {
		own, other, err = a.cursors(r)
	}
	if err != nil {
		writeError(w, err)
		return 0, 0, 0, false
	}
	return chatID, own, other, true
}

func (a *API) handleHistory(w http.ResponseWriter, r *http.Request) {
	if n, own, other, latest, err := a.latestParams(r); latest || err != nil {
		chatID, cerr := chat.ParseChatID(r.PathValue("chat_id"))
		if err = cmp.Or(cerr, err); err != nil {
			writeError(w, err)
			return
		}
		a.handleLatest(w, r, chatID, n, own, other)
		return
	}
	chatID, own, other, ok := a.room(w, r, r.PathValue("chat_id"))
	if !ok {
		return
	}
	limit := DefaultHistoryLimit
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxHistoryLimit {
			writeError(w, &chat.FieldError{Field: "limit", Msg: "must be an integer from 1 to 10000"})
			return
		}
		limit = n
	}
	h, err := a.deps.Reader.History(r.Context(), chatID, own, other, limit)
	if err != nil {
		a.log.Warn("history failed", "chat_id", chatID, "err", err)
		if errors.Is(err, chat.ErrReadTimeout) {
			writeJSON(w, http.StatusServiceUnavailable, ErrorBody{Error: "timed out reading the chat"})
			return
		}
		writeError(w, err)
		return
	}
	msgs := chat.MergeBySentAt(h.Sent, h.Received)
	writeJSON(w, http.StatusOK, map[string]any{"messages": msgs, "more": h.More})
}

func (a *API) handleWS(w http.ResponseWriter, r *http.Request) {
	chatID, own, other, ok := a.room(w, r, r.URL.Query().Get("chat_id"))
	if !ok {
		return
	}
	last, err := wsLast(r)
	if err != nil {
		writeError(w, err)
		return
	}
	a.sockets.Add(1)
	defer a.sockets.Done()
	select {
	case <-a.closing:
		writeJSON(w, http.StatusServiceUnavailable, ErrorBody{Error: "service stopping"})
		return
	default:
	}
	// With auth on, a token in Sec-WebSocket-Protocol was checked by the
	// middleware (principal set); without one the first frame must carry it.
	firstFrame := a.verifier != nil && auth.PrincipalOf(r.Context()) == nil
	if !firstFrame {
		release, ok := a.guard.openSocket(w, userOf(r))
		if !ok {
			return
		}
		defer release()
	}
	// The guard checked Origin against the allow-list (guard.wrap); the
	// library's own check (Origin host = Host) would refuse allowed ones.
	c, err := acceptWS(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true, Subprotocols: []string{chat.WSProtocol}})
	if err != nil {
		return // acceptWS wrote the HTTP error.
	}
	defer c.CloseNow() // ends the reader below, whose reads no context cancels
	c.SetReadLimit(int64(a.maxBody)*6 + 1024)
	a.ws.opened()
	defer a.ws.closed()
	if firstFrame {
		p, release, ok := a.wsFirstFrame(r.Context(), c, chatID)
		if !ok {
			return
		}
		defer release()
		r = r.WithContext(auth.WithPrincipal(r.Context(), p))
	}
	if last > 0 || (last == 0 && r.URL.Query().Has("last")) {
		if a.deps.Browser == nil {
			c.Close(websocket.StatusInternalError, "last is not served here")
			return
		}
		if own, other, err = a.wsStart(r.Context(), chatID, last); err != nil {
			a.log.Warn("websocket start failed", "chat_id", chatID, "err", err)
			c.Close(websocket.StatusTryAgainLater, "could not read the chat: reconnect")
			return
		}
	}
	frames, evicted, unsubscribe := a.deps.Rooms.Follow(chatID, own, other)
	defer unsubscribe()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	var liveFrames <-chan []byte
	typing := func() {}
	if a.deps.Live != nil {
		var leave func()
		liveFrames, typing, leave = a.deps.Live.Join(chatID, auth.AuthorOf(r.Context()))
		defer leave()
	}
	expired, revocation := tokenExpiry(ctx), a.watchRevocation(ctx)
	pingFailed := a.keepAlive(ctx, c)
	// The room's delivered watermark first (receipts the client may have
	// missed while disconnected); live receipts follow as frames. Read after
	// Subscribe, so a receipt applied in between is pushed, not missed.
	fw := newFrameWriter(c, wsWriteTimeout)
	defer fw.stop()
	if seq, at, err := a.deps.Reader.DeliveredUpTo(ctx, chatID); err == nil && seq > 0 {
		b, _ := json.Marshal(chat.ReceiptFrame{ChatID: chatID, From: a.service, UptoSeq: seq, DeliveredAt: at})
		if err := fw.write(b); err != nil {
			return
		}
		a.ws.frameOut()
	}
	// The room's read watermark likewise.
	if a.deps.Browser != nil {
		if seq, at, err := a.deps.Browser.ReadUpTo(ctx, chatID); err == nil && seq > 0 {
			b, _ := json.Marshal(chat.ReadFrame{ChatID: chatID, From: a.service, UptoSeq: seq, ReadAt: at})
			if err := fw.write(b); err != nil {
				return
			}
			a.ws.frameOut()
		}
	}
	// Reader: client frames (wsframes.go). Sends, edits, deletes and reads
	// run concurrently, answered through replies; typing goes to Live.
	replies := make(chan *[]byte, maxInFlight)
	sess := a.newWSSession(ctx, r, chatID, typing, replies)
	defer func() { cancel(); sess.wait() }()
	go func() {
		defer cancel()
		// One buffer for the socket's frames: handle decodes a frame
		// (copying what it keeps) before the next is read, and
		// websocket.Conn.Read would allocate each frame anew.
		// The reads take a context that is never done: a done-able one
		// costs each read an AfterFunc registration (allocations and a lock
		// on the parent), and the socket is closed when the handler returns
		// (CloseNow above), which ends a read as a cancel would.
		var buf bytes.Buffer
		rctx := context.WithoutCancel(ctx)
		for {
			typ, rd, err := c.Reader(rctx)
			if err == nil {
				buf.Reset()
				_, err = buf.ReadFrom(rd)
			}
			if err != nil {
				return
			}
			a.ws.frameIn()
			sess.handle(typ, buf.Bytes())
		}
	}()
	// The rare events — the socket's end, an eviction, the token's expiry
	// or revocation, a failed ping — are watched by a goroutine of their
	// own, which hands the loop below what to do then. The loop, woken for
	// every frame, waits on 4 channels instead of 9: a select locks and
	// queues on each of its channels every time, and that was most of the
	// loop's own cost per frame.
	stop := make(chan func(), 1)
	go func() { stop <- a.wsStopOn(ctx, r, c, chatID, evicted, expired, revocation, pingFailed) }()
	for {
		var frame []byte
		var reply *[]byte
		select {
		case act := <-stop:
			act()
			return
		case frame = <-frames:
		case frame = <-liveFrames:
		case reply = <-replies:
			frame = *reply
		}
		err := fw.write(frame)
		if reply != nil {
			putFrameBuf(reply)
		}
		if err != nil {
			if ctx.Err() == nil && fw.timedOut() {
				a.dropSocket(r, chatID, "write_timeout", err)
			}
			var ne net.Error
			if !errors.As(err, &ne) {
				c.CloseNow()
			}
			return
		}
		a.ws.frameOut()
	}
}
