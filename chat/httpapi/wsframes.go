package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/auth"

	"github.com/coder/websocket"
)

// maxInFlight bounds the frames one socket may have in flight (sent, not
// answered yet): the reader stops reading the socket while it is at the
// bound, so a client that floods frames waits on its own socket (TCP
// back-pressure) instead of taking more of the database's connections.
const maxInFlight = 64

// frameBufs holds the buffers answers are encoded into (*[]byte). The
// writer loop returns each after its write (the library copies the frame
// into its own buffer); those grown past maxPooledAnswer are left to the GC.
var frameBufs = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

// getFrameBuf returns an empty buffer from frameBufs.
func getFrameBuf() *[]byte {
	bp := frameBufs.Get().(*[]byte)
	*bp = (*bp)[:0]
	return bp
}

// putFrameBuf returns bp to frameBufs unless it grew too large.
func putFrameBuf(bp *[]byte) {
	if cap(*bp) <= maxPooledAnswer {
		frameBufs.Put(bp)
	}
}

// wsSession is one socket's handling of client frames: it reads them (the
// reader goroutine of handleWS), runs sends, edits, deletes and reads
// concurrently (at most maxInFlight), and hands each answer to the
// socket's writer loop on replies. Its methods other than wait are called
// from the reader goroutine only.
type wsSession struct {
	a      *API
	chatID int64 // the socket's chat
	user   string
	// ctx ends with the socket; work runs on a context without its
	// cancellation, so that a send the socket's end interrupts is either
	// committed or rolled back by the store, never cut off mid-way by us
	// (the client resends with the same client_id to learn which).
	ctx, work context.Context
	typing    func()
	replies   chan<- *[]byte
	slots     chan struct{}
	wg        sync.WaitGroup
}

// newWSSession returns the session of a socket of r's principal on chatID.
func (a *API) newWSSession(ctx context.Context, r *http.Request, chatID int64, typing func(), replies chan<- *[]byte) *wsSession {
	return &wsSession{a: a, chatID: chatID, user: userOf(r), ctx: ctx, work: context.WithoutCancel(ctx),
		typing: typing, replies: replies, slots: make(chan struct{}, maxInFlight)}
}

// wait waits for the frames in flight (their answers are dropped once ctx
// ended).
func (s *wsSession) wait() { s.wg.Wait() }

// reply hands an answer to the writer loop, or drops it when the socket
// ended.
func (s *wsSession) reply(bp *[]byte) {
	select {
	case s.replies <- bp:
	case <-s.ctx.Done():
		putFrameBuf(bp)
	}
}

// replyError answers a frame with an error frame.
func (s *wsSession) replyError(clientID, msg, field string) {
	bp := getFrameBuf()
	*bp = chat.AppendErrorFrame(*bp, clientID, msg, field)
	s.reply(bp)
}

// legacyError answers a frame without "type" (the {"body"} send frame of
// before typed frames) as it always was: {"error", "field"}.
func (s *wsSession) legacyError(eb ErrorBody) {
	b, _ := json.Marshal(eb)
	bp := getFrameBuf()
	*bp = append(*bp, b...)
	s.reply(bp)
}

// handle answers one client frame (typ, data).
func (s *wsSession) handle(typ websocket.MessageType, data []byte) {
	if typ != websocket.MessageText {
		s.replyError("", `send text frames holding {"type": "send", "client_id": "…", "body": "…"}`, "")
		return
	}
	if !bytes.Contains(data, []byte(`"type"`)) {
		s.legacySend(data)
		return
	}
	f, err := chat.DecodeClientFrame(data, s.a.maxBody)
	if f.Untyped { // "type" was a value, not a key
		s.legacySend(data)
		return
	}
	if err != nil {
		var fe *chat.FieldError
		errors.As(err, &fe)
		s.replyError(f.ClientID, fe.Error(), fe.Field)
		return
	}
	chatID := cmpOr(f.ChatID, s.chatID)
	if msg, field := s.refused(chatID); msg != "" {
		s.replyError(f.ClientID, msg, field)
		return
	}
	if f.Type == chat.FrameTyping {
		if chatID != s.chatID {
			s.replyError(f.ClientID, "typing is signalled on the chat's own socket", "chat_id")
			return
		}
		s.typing()
		return
	}
	if err := s.a.sendAllowed(s.user); err != nil {
		s.replyError(f.ClientID, err.Error(), "")
		return
	}
	select {
	case s.slots <- struct{}{}:
	case <-s.ctx.Done():
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer func() { <-s.slots }()
		s.run(f, chatID)
	}()
}

// cmpOr returns a, or b when a is 0.
func cmpOr(a, b int64) int64 {
	if a != 0 {
		return a
	}
	return b
}

// refused checks the socket's token for a frame on chatID: a token that
// expired (the socket is closed for it a moment later) or does not cover
// the chat refuses the frame; msg "" lets it through.
func (s *wsSession) refused(chatID int64) (msg, field string) {
	p := auth.PrincipalOf(s.ctx)
	if p == nil {
		return "", ""
	}
	if !p.Expires.IsZero() && !time.Now().Before(p.Expires) {
		return "token expired: reconnect with a new token", "token"
	}
	if !p.Chats.Allows(chatID) {
		return "token does not cover chat " + strconv.FormatInt(chatID, 10), "chat_id"
	}
	return "", ""
}

// run does one frame's work and answers it.
func (s *wsSession) run(f chat.ClientFrame, chatID int64) {
	switch f.Type {
	case chat.FrameSend:
		m, _, err := s.a.send(s.work, chatID, f.Body, f.ClientID)
		if err != nil {
			s.failed(f.ClientID, chatID, err)
			return
		}
		bp := getFrameBuf()
		*bp = chat.AppendAckFrame(*bp, f.ClientID, m)
		s.reply(bp)
	case chat.FrameEdit, chat.FrameDelete:
		s.change(f, chatID)
	case chat.FrameRead:
		if s.a.deps.Changer == nil {
			s.replyError(f.ClientID, "not served here", "type")
			return
		}
		res, err := s.a.deps.Changer.MarkRead(s.work, chatID, auth.AuthorOf(s.work), f.UptoSeq)
		if err != nil {
			s.a.log.Warn("websocket read mark failed", "chat_id", chatID, "err", err)
			s.replyError(f.ClientID, "could not record the read; retry", "")
			return
		}
		bp := getFrameBuf()
		*bp = chat.AppendReadAckFrame(*bp, f.ClientID, res)
		s.reply(bp)
	}
}

// failed answers a failed send as the HTTP send would, as an error frame.
func (s *wsSession) failed(clientID string, chatID int64, err error) {
	code, eb := sendError(err, "client_id")
	if code == http.StatusServiceUnavailable && s.ctx.Err() == nil {
		s.a.log.Warn("websocket send failed", "chat_id", chatID, "err", err)
	}
	s.replyError(clientID, eb.Error, eb.Field)
}

// change runs an edit or delete frame with the HTTP route's answers.
func (s *wsSession) change(f chat.ClientFrame, chatID int64) {
	if s.a.deps.Changer == nil {
		s.replyError(f.ClientID, "not served here", "type")
		return
	}
	m, err := s.a.deps.Changer.Change(s.work, chatID, f.MessageID, f.Body, f.Type == chat.FrameDelete, auth.AuthorOf(s.work))
	if err != nil {
		_, eb := s.a.changeError(chatID, f.MessageID, err)
		s.replyError(f.ClientID, eb.Error, eb.Field)
		return
	}
	bp := getFrameBuf()
	*bp = chat.AppendChangeAckFrame(*bp, f.ClientID, m)
	s.reply(bp)
}

// legacySend is a frame of the first protocol, {"body": "…"[, "client_id":
// "…"]}: stored like a send frame, answered only when it fails
// ({"error", "field"}), one at a time.
func (s *wsSession) legacySend(data []byte) {
	err := s.a.sendAllowed(s.user)
	var req chat.SendRequest
	if err == nil {
		req, err = chat.DecodeSendRequest(data, s.a.maxBody)
	}
	if err == nil {
		_, _, err = s.a.send(s.ctx, s.chatID, req.Body, req.ClientID)
	}
	if err != nil {
		_, eb := sendError(err, "client_id")
		if s.ctx.Err() == nil && !errors.As(err, new(*chat.FieldError)) && !errors.Is(err, chat.ErrIdempotencyConflict) {
			s.a.log.Warn("websocket send failed", "chat_id", s.chatID, "err", err)
		}
		s.legacyError(eb)
	}
}
