package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/auth"

	"github.com/coder/websocket"
)

// keepAlive pings c every PingInterval until ctx ends. The returned channel
// is closed when a pong did not come within PongTimeout: the peer is gone or
// not reading (a client that never reads never answers, since pongs are
// read with its frames). It needs a concurrent Read on c (handleWS's
// reader), which is where the pong is taken.
func (a *API) keepAlive(ctx context.Context, c *websocket.Conn) <-chan struct{} {
	failed := make(chan struct{})
	go func() {
		t := time.NewTicker(a.guard.cfg.PingInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			pctx, cancel := context.WithTimeout(ctx, a.guard.cfg.PongTimeout)
			err := c.Ping(pctx)
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					close(failed)
				}
				return
			}
		}
	}()
	return failed
}

// dropSocket logs and counts (outboxchat_ws_evictions_total) a WebSocket the server drops: reason is
// "slow" (fell a client buffer behind), "write_timeout" (a frame took over
// the write timeout) or "ping_timeout" (no pong in time).
func (a *API) dropSocket(r *http.Request, chatID int64, reason string, err error) {
	attrs := []any{"reason", reason, "chat_id", chatID, "remote", r.RemoteAddr, "user", userOf(r)}
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	a.log.Warn("websocket dropped", attrs...)
	a.ws.evicted(reason)
}

// sendAllowed applies the per-user rate limit to a WebSocket send frame: a
// *FieldError to answer with, or nil.
func (a *API) sendAllowed(user string) error {
	if d := a.guard.userSend(user); d > 0 {
		a.guard.count("rate_user")
		return &chat.FieldError{Msg: fmt.Sprintf("too many messages: retry after %d s", int(math.Ceil(d.Seconds())))}
	}
	return nil
}

// bodyUnreadable answers a request whose body could not be read: 408 and
// the connection closed when the body read deadline passed (a client
// trickling its body), else 400.
func bodyUnreadable(w http.ResponseWriter, err error) {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		w.Header().Set("Connection", "close")
		writeJSON(w, http.StatusRequestTimeout, ErrorBody{Error: "request body not received in time", Field: "body"})
		return
	}
	writeError(w, &chat.FieldError{Field: "body", Msg: "request unreadable"})
}

// wsFirstFrame authenticates a WebSocket whose upgrade carried no token:
// its first frame must be {"token": "<jwt>"} within firstFrameWait, for a
// token covering chatID, and the user must be under the socket cap.
// Otherwise it closes c with 4401, 4403 or 4429 and reports ok false. On
// success release must be called when the socket closes.
func (a *API) wsFirstFrame(ctx context.Context, c *websocket.Conn, chatID int64) (p *auth.Principal, release func(), ok bool) {
	rctx, cancel := context.WithTimeout(ctx, firstFrameWait)
	typ, data, err := c.Read(rctx)
	cancel()
	if err != nil {
		c.Close(chat.CloseUnauthorized, `no token: send {"token": "<jwt>"} first`)
		return nil, nil, false
	}
	var f struct {
		Token string `json:"token"`
	}
	if typ != websocket.MessageText || json.Unmarshal(data, &f) != nil || f.Token == "" {
		c.Close(chat.CloseUnauthorized, `the first frame must be {"token": "<jwt>"}`)
		return nil, nil, false
	}
	if p, err = a.verifier.Verify(f.Token); err != nil {
		c.Close(chat.CloseUnauthorized, "invalid token")
		return nil, nil, false
	}
	if !p.Chats.Allows(chatID) {
		c.Close(chat.CloseForbidden, "token does not cover chat "+strconv.FormatInt(chatID, 10))
		return nil, nil, false
	}
	if release, ok = a.guard.takeSocket("user:" + p.User); !ok {
		c.Close(chat.CloseTooMany, "too many WebSockets for this user")
		return nil, nil, false
	}
	return p, release, true
}

// tokenExpiry fires when the token of ctx's principal expires (never
// without one).
func tokenExpiry(ctx context.Context) <-chan time.Time {
	p := auth.PrincipalOf(ctx)
	if p == nil {
		return nil
	}
	t := time.NewTimer(time.Until(p.Expires))
	context.AfterFunc(ctx, func() { t.Stop() })
	return t.C
}

// revocationWatch tells a WebSocket's watcher (wsStopOn) when its token
// is revoked (auth.Revocations; the server reads new revocations every
// second) without a goroutine of its own: the watcher selects on
// changed() and asks revoked() when it fires. A nil watch (no principal)
// never fires. Not safe for concurrent use: the socket's watcher owns it.
type revocationWatch struct {
	rev *auth.Revocations
	p   *auth.Principal
	c   <-chan struct{}
}

// closedChan is a channel that is always ready.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// watchRevocation returns the watch of ctx's principal, nil without one.
// A token revoked already makes changed() ready at once.
func (a *API) watchRevocation(ctx context.Context) *revocationWatch {
	p := auth.PrincipalOf(ctx)
	if p == nil || a.verifier == nil {
		return nil
	}
	w := &revocationWatch{rev: a.verifier.Revocations(), p: p}
	w.c = w.rev.Changed()
	if w.rev.Revoked(p) {
		w.c = closedChan
	}
	return w
}

// changed is ready when the revocation set changed since the last call of
// revoked (or the watch began).
func (w *revocationWatch) changed() <-chan struct{} {
	if w == nil {
		return nil
	}
	return w.c
}

// wsStopOn waits for the first event that ends a WebSocket and returns
// what handleWS's loop is to do then (close the socket with the reason,
// count a drop). It is the only user of revocation meanwhile.
func (a *API) wsStopOn(ctx context.Context, r *http.Request, c *websocket.Conn, chatID int64, evicted <-chan struct{},
	expired <-chan time.Time, revocation *revocationWatch, pingFailed <-chan struct{}) func() {
	for {
		select {
		case <-ctx.Done():
			return func() { c.Close(websocket.StatusNormalClosure, "") }
		case <-a.closing:
			return func() { c.Close(websocket.StatusGoingAway, "service stopping: reconnect with your cursors") }
		case <-evicted:
			return func() {
				a.dropSocket(r, chatID, "slow", nil)
				c.Close(websocket.StatusPolicyViolation, "too slow: reconnect with your cursors")
			}
		case <-expired:
			return func() { c.Close(chat.CloseUnauthorized, "token expired: reconnect with a new token and your cursors") }
		case <-revocation.changed():
			if revocation.revoked() {
				return func() { c.Close(chat.CloseUnauthorized, "token revoked") }
			}
		case <-pingFailed:
			return func() {
				a.dropSocket(r, chatID, "ping_timeout", nil)
				c.CloseNow()
			}
		}
	}
}

// revoked re-arms changed and reports whether the token is revoked now.
// Re-arming first means a change between the two is not missed.
func (w *revocationWatch) revoked() bool {
	w.c = w.rev.Changed()
	return w.rev.Revoked(w.p)
}

// frameWriter writes a socket's frames, each bounded by a write timeout.
// One timer per socket, re-armed for each write, closes the socket
// (CloseNow) when a write outlasts it, which fails that write. The writes
// themselves get a context without Done: the library then sets up no
// cancellation of its own for each frame, and a context.WithTimeout per
// frame cost a context, a timer and the parent's cancel bookkeeping for
// every frame pushed. A write therefore ends when it completes, when the
// timer closes the socket, or when the socket is closed otherwise (the
// peer went away: the reader's Read fails and handleWS returns). A timer
// that fires just as a write completes in time closes the socket all the
// same (the next write fails), as a write timeout: that write took all of
// the timeout anyway. Not safe for concurrent use (handleWS's loop is its
// only writer).
type frameWriter struct {
	c       *websocket.Conn
	timer   *time.Timer
	timeout time.Duration
	expired atomic.Bool
}

// newFrameWriter returns a frameWriter for c with the given timeout per
// write. The caller calls stop when done.
func newFrameWriter(c *websocket.Conn, timeout time.Duration) *frameWriter {
	fw := &frameWriter{c: c, timeout: timeout}
	fw.timer = time.AfterFunc(timeout, func() {
		fw.expired.Store(true)
		_ = c.CloseNow()
	})
	fw.timer.Stop()
	return fw
}

// write writes b as one text frame.
func (fw *frameWriter) write(b []byte) error {
	fw.timer.Reset(fw.timeout)
	err := fw.c.Write(context.Background(), websocket.MessageText, b)
	fw.timer.Stop()
	return err
}

// timedOut reports whether a write outlasted the timeout (the socket is
// then closed).
func (fw *frameWriter) timedOut() bool { return fw.expired.Load() }

// stop releases the timer.
func (fw *frameWriter) stop() { fw.timer.Stop() }
