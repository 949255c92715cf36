package httpapi

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/auth"
)

// userOf names the user a request counts against for rate limits and the
// WebSocket cap: the token's subject, or "ip:<client IP>" when auth is off.
func userOf(r *http.Request) string {
	if p := auth.PrincipalOf(r.Context()); p != nil {
		return "user:" + p.User
	}
	return "ip:" + clientIP(r)
}

// firstFrameWait bounds the wait for a {"token"} first frame.
const firstFrameWait = 10 * time.Second

// authenticate is the API's auth middleware (nil v: auth off, every request
// passes). API requests need "Authorization: Bearer <jwt>" (401 otherwise,
// with WWW-Authenticate); a request for a chat outside the token's chats
// gets 403 before any handler runs, so nothing is stored. A WebSocket may
// carry its token in Sec-WebSocket-Protocol (checked here the same way) or
// in its first frame (checked by handleWS after the upgrade). On success
// the request's context carries the Principal. Other paths (the page,
// metrics, health) pass untouched.
func authenticate(v *auth.Verifier, next http.Handler) http.Handler {
	if v == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var token, rawChat string
		switch {
		case r.URL.Path == "/ws":
			token = wsBearer(r)
			if token == "" {
				next.ServeHTTP(w, r) // first-frame auth, after the upgrade
				return
			}
			rawChat = r.URL.Query().Get("chat_id")
		case strings.HasPrefix(r.URL.Path, "/api/"):
			if h := r.Header.Get("Authorization"); len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
				token = strings.TrimSpace(h[7:])
			}
			if rest, ok := strings.CutPrefix(r.URL.Path, "/api/chats/"); ok {
				rawChat, _, _ = strings.Cut(rest, "/")
			}
		default:
			next.ServeHTTP(w, r)
			return
		}
		if token == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="outboxchat"`)
			writeJSON(w, http.StatusUnauthorized, ErrorBody{Error: "missing bearer token", Field: "Authorization"})
			return
		}
		p, err := v.Verify(token)
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="outboxchat", error="invalid_token"`)
			writeJSON(w, http.StatusUnauthorized, ErrorBody{Error: err.Error(), Field: "Authorization"})
			return
		}
		// A chat id that does not parse is the handler's 400.
		if id, err := chat.ParseChatID(rawChat); err == nil && !p.Chats.Allows(id) {
			writeJSON(w, http.StatusForbidden, ErrorBody{Error: "token does not cover chat " + strconv.FormatInt(id, 10), Field: "chat_id"})
			return
		}
		next.ServeHTTP(w, r.WithContext(auth.WithPrincipal(r.Context(), p)))
	})
}

// wsBearer returns the token offered as a "bearer.<jwt>" subprotocol, or "".
func wsBearer(r *http.Request) string {
	for _, h := range r.Header.Values("Sec-WebSocket-Protocol") {
		for _, p := range strings.Split(h, ",") {
			if t, ok := strings.CutPrefix(strings.TrimSpace(p), chat.WSBearerPrefix); ok {
				return t
			}
		}
	}
	return ""
}
