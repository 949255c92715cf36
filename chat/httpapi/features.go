package httpapi

import (
	"context"
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/auth"
)

// Browser reads a chat newest first and lists chats: Latest is a page of
// the newest n messages below the cursors (0: no bound), both origins
// merged, oldest first; Chats the chats holding messages, newest first
// (ids nil: every chat; else only those), with reader's unread counts;
// ReadUpTo the highest of this service's seqs that the other side read,
// with its time (0 for none).
type Browser interface {
	Latest(ctx context.Context, chatID, beforeSent, beforeReceived int64, n int) (chat.Page, error)
	Chats(ctx context.Context, ids []int64, reader string, limit int, after chat.ChatCursor) ([]chat.ChatSummary, chat.ChatCursor, error)
	ReadUpTo(ctx context.Context, chatID int64) (int64, time.Time, error)
}

// Changer edits and deletes messages and records reads. Change errors:
// chat.ErrNoMessage, chat.ErrNotAuthor, chat.ErrDeletedMessage (wrapped).
type Changer interface {
	Change(ctx context.Context, chatID int64, messageID, body string, deleted bool, author string) (chat.Message, error)
	MarkRead(ctx context.Context, chatID int64, reader string, upto int64) (chat.ReadResult, error)
}

// Live carries typing and presence (ephemeral, at-most-once): Join adds a
// WebSocket client of author to a chat and returns its frames (others'
// typing, presence), a typing signal to send (rate-limited), and leave.
type Live interface {
	Join(chatID int64, author string) (frames <-chan []byte, typing func(), leave func())
}

// Page limits.
const (
	DefaultLastLimit     = 50
	DefaultChatListLimit = 50
	maxChatListLimit     = 500
)

// latestParams reads last, before_consumers and before_workers; ok false
// when none is given (the forward history).
func (a *API) latestParams(r *http.Request) (n int, own, other int64, ok bool, err error) {
	q := r.URL.Query()
	_, hasLast := q["last"]
	_, hasBC := q["before_"+chat.Consumers]
	_, hasBW := q["before_"+chat.Workers]
	if !hasLast && !hasBC && !hasBW {
		return 0, 0, 0, false, nil
	}
	for _, k := range []string{"after_seq", "after_" + chat.Consumers, "after_" + chat.Workers} {
		if q.Has(k) {
			return 0, 0, 0, true, &chat.FieldError{Field: k, Msg: "cannot be combined with last or before_* (pages go one way)"}
		}
	}
	n = DefaultLastLimit
	if v := q.Get("last"); hasLast {
		if n, err = strconv.Atoi(v); err != nil || n < 1 || n > maxHistoryLimit {
			return 0, 0, 0, true, &chat.FieldError{Field: "last", Msg: "must be an integer from 1 to 10000"}
		}
	}
	by := map[string]int64{}
	for _, s := range []string{chat.Consumers, chat.Workers} {
		if by[s], err = chat.ParseSeq("before_"+s, q.Get("before_"+s)); err != nil {
			return 0, 0, 0, true, err
		}
	}
	return n, by[a.service], by[chat.Peer(a.service)], true, nil
}

// handleLatest answers GET /api/chats/{id}/messages?last=N[&before_consumers=&before_workers=]:
// {"messages": [...oldest first], "more_before": bool, "before_consumers": N, "before_workers": N}.
func (a *API) handleLatest(w http.ResponseWriter, r *http.Request, chatID int64, n int, own, other int64) {
	if a.deps.Browser == nil {
		writeJSON(w, http.StatusNotImplemented, ErrorBody{Error: "not served here"})
		return
	}
	p, err := a.deps.Browser.Latest(r.Context(), chatID, own, other, n)
	if err != nil {
		a.readFailed(w, chatID, err)
		return
	}
	msgs := p.Messages
	if msgs == nil {
		msgs = []chat.Message{}
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"messages": msgs, "more_before": p.MoreBefore,
		"before_" + a.service: p.BeforeSent, "before_" + chat.Peer(a.service): p.BeforeReceived,
	})
}

// readFailed answers a failed read: 503, with the cause logged.
func (a *API) readFailed(w http.ResponseWriter, chatID int64, err error) {
	a.log.Warn("read failed", "chat_id", chatID, "err", err)
	if errors.Is(err, chat.ErrReadTimeout) {
		writeJSON(w, http.StatusServiceUnavailable, ErrorBody{Error: "timed out reading the chat"})
		return
	}
	writeError(w, err)
}

// handleChats answers GET /api/chats[?limit=N&cursor=C]:
// {"chats": [{"chat_id", "last_message", "unread"}], "next_cursor": "…"|null}.
func (a *API) handleChats(w http.ResponseWriter, r *http.Request) {
	if a.deps.Browser == nil {
		writeJSON(w, http.StatusNotImplemented, ErrorBody{Error: "not served here"})
		return
	}
	q := r.URL.Query()
	limit := DefaultChatListLimit
	if v := q.Get("limit"); q.Has("limit") {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxChatListLimit {
			writeError(w, &chat.FieldError{Field: "limit", Msg: "must be an integer from 1 to 500"})
			return
		}
		limit = n
	}
	after, err := chat.ParseChatCursor(q.Get("cursor"))
	if err != nil {
		writeError(w, err)
		return
	}
	var ids []int64
	if p := auth.PrincipalOf(r.Context()); p != nil && !p.Chats.All {
		ids = append([]int64{}, p.Chats.IDs...)
	}
	list, next, err := a.deps.Browser.Chats(r.Context(), ids, auth.AuthorOf(r.Context()), limit, after)
	if err != nil {
		a.readFailed(w, 0, err)
		return
	}
	if list == nil {
		list = []chat.ChatSummary{}
	}
	var nextCursor *string
	if next.ChatID != 0 {
		s := next.String()
		nextCursor = &s
	}
	writeJSON(w, http.StatusOK, map[string]any{"chats": list, "next_cursor": nextCursor})
}

// jsonBody reads a JSON request body of at most limit bytes; on failure it
// answers and reports false.
func (a *API) jsonBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		writeJSON(w, http.StatusUnsupportedMediaType, ErrorBody{Error: "Content-Type must be application/json", Field: "Content-Type"})
		return nil, false
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(a.maxBody)*6+1024))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeJSON(w, http.StatusRequestEntityTooLarge, ErrorBody{Error: "request too large", Field: "body"})
			return nil, false
		}
		bodyUnreadable(w, err)
		return nil, false
	}
	return data, true
}

// changeTarget parses the chat and message ids of a change.
func changeTarget(w http.ResponseWriter, r *http.Request) (int64, string, bool) {
	chatID, err := chat.ParseChatID(r.PathValue("chat_id"))
	if err != nil {
		writeError(w, err)
		return 0, "", false
	}
	id, err := chat.ParseMessageID(r.PathValue("message_id"))
	if err != nil {
		writeError(w, err)
		return 0, "", false
	}
	return chatID, id, true
}

// handleEdit answers PATCH /api/chats/{chat_id}/messages/{message_id}
// {"body": "…"}: 200 the message at its new version.
func (a *API) handleEdit(w http.ResponseWriter, r *http.Request) {
	chatID, id, ok := changeTarget(w, r)
	if !ok {
		return
	}
	data, ok := a.jsonBody(w, r)
	if !ok {
		return
	}
	body, err := chat.DecodeEditRequest(data, a.maxBody)
	if err != nil {
		writeError(w, err)
		return
	}
	a.change(w, r, chatID, id, body, false)
}

// handleDelete answers DELETE /api/chats/{chat_id}/messages/{message_id}:
// 200 the message, deleted.
func (a *API) handleDelete(w http.ResponseWriter, r *http.Request) {
	chatID, id, ok := changeTarget(w, r)
	if !ok {
		return
	}
	a.change(w, r, chatID, id, "", true)
}

func (a *API) change(w http.ResponseWriter, r *http.Request, chatID int64, id, body string, deleted bool) {
	if a.deps.Changer == nil {
		writeJSON(w, http.StatusNotImplemented, ErrorBody{Error: "not served here"})
		return
	}
	if err := a.sendAllowed(userOf(r)); err != nil {
		writeJSON(w, http.StatusTooManyRequests, ErrorBody{Error: err.Error()})
		return
	}
	m, err := a.deps.Changer.Change(r.Context(), chatID, id, body, deleted, auth.AuthorOf(r.Context()))
	if err != nil {
		code, eb := a.changeError(chatID, id, err)
		if code == http.StatusServiceUnavailable {
			w.Header().Set("Retry-After", "1")
		}
		writeJSON(w, code, eb)
		return
	}
	writeJSON(w, http.StatusOK, m)
}

// changeError maps a failed edit or delete of message id to its status and
// body (404, 403, 409, or 503 with the cause logged), for the HTTP route
// and the WebSocket frame alike.
func (a *API) changeError(chatID int64, id string, err error) (int, ErrorBody) {
	switch {
	case errors.Is(err, chat.ErrNoMessage):
		return http.StatusNotFound, ErrorBody{Error: "no message " + id + " of " + a.service + " in chat " + strconv.FormatInt(chatID, 10), Field: "message_id"}
	case errors.Is(err, chat.ErrNotAuthor):
		return http.StatusForbidden, ErrorBody{Error: chat.ErrNotAuthor.Error(), Field: "message_id"}
	case errors.Is(err, chat.ErrDeletedMessage):
		return http.StatusConflict, ErrorBody{Error: chat.ErrDeletedMessage.Error(), Field: "message_id"}
	}
	a.log.Warn("change failed", "chat_id", chatID, "message_id", id, "err", err)
	return http.StatusServiceUnavailable, ErrorBody{Error: "could not change the message; retry"}
}

// handleRead answers POST /api/chats/{chat_id}/read {"upto_seq": N}:
// 200 {"chat_id", "upto_seq", "read_at", "unread"}.
func (a *API) handleRead(w http.ResponseWriter, r *http.Request) {
	chatID, err := chat.ParseChatID(r.PathValue("chat_id"))
	if err != nil {
		writeError(w, err)
		return
	}
	data, ok := a.jsonBody(w, r)
	if !ok {
		return
	}
	upto, err := chat.DecodeReadRequest(data)
	if err != nil {
		writeError(w, err)
		return
	}
	if a.deps.Changer == nil {
		writeJSON(w, http.StatusNotImplemented, ErrorBody{Error: "not served here"})
		return
	}
	res, err := a.deps.Changer.MarkRead(r.Context(), chatID, auth.AuthorOf(r.Context()), upto)
	if err != nil {
		a.log.Warn("mark read failed", "chat_id", chatID, "err", err)
		writeJSON(w, http.StatusServiceUnavailable, ErrorBody{Error: "could not record the read; retry"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"chat_id": res.ChatID, "upto_seq": res.UptoSeq, "read_at": res.ReadAt.UTC().Format("2006-01-02T15:04:05.000000Z07:00"), "unread": res.Unread})
}

// wsStart returns the cursors a socket opened with ?last=N starts from: the
// seqs just below the oldest message of each origin among the newest N,
// or that origin's newest seq when none of its messages is among them, so
// the gateway pushes exactly those N, then live ones.
func (a *API) wsStart(ctx context.Context, chatID int64, n int) (own, other int64, err error) {
	p, err := a.deps.Browser.Latest(ctx, chatID, 0, 0, n)
	if err != nil {
		return 0, 0, err
	}
	own, other = p.TopSent, p.TopReceived
	for _, m := range p.Messages {
		if m.From == a.service {
			own = min(own, m.Seq-1)
		} else {
			other = min(other, m.Seq-1)
		}
	}
	return own, other, nil
}

// wsLast reads ?last=N of a WebSocket (0: not given).
func wsLast(r *http.Request) (int, error) {
	q := r.URL.Query()
	if !q.Has("last") {
		return 0, nil
	}
	n, err := strconv.Atoi(q.Get("last"))
	if err != nil || n < 0 || n > maxHistoryLimit {
		return 0, &chat.FieldError{Field: "last", Msg: "must be an integer from 0 to 10000"}
	}
	if q.Has("after_seq") || q.Has("after_"+chat.Consumers) || q.Has("after_"+chat.Workers) {
		return -1, nil // cursors win: a reconnect catches up exactly
	}
	return n, nil
}
