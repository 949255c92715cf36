package httpapi

import (
	"bytes"
	"net/http"
	"strings"

	"github.com/coder/websocket"
)

// withJSONErrors serves mux, but answers what mux has no route for in the
// API's error shape instead of net/http's plain text: 404 {"error": "no
// such endpoint: GET /x", "field": ""}, and 405 {"error": "method POST not
// allowed on /healthz; allowed: GET, HEAD", "field": ""} with the Allow
// header. Matched requests (and mux's path-cleaning redirects) are served by
// mux unchanged. Safe for concurrent use.
func withJSONErrors(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, pattern := mux.Handler(r)
		if pattern != "" {
			mux.ServeHTTP(w, r) // sets r's path values, which Handler does not
			return
		}
		// No route: h is mux's 404 or 405 handler. Run it against a
		// recorder to learn which, and the Allow header of a 405.
		rec := &headerRecorder{header: http.Header{}}
		h.ServeHTTP(rec, r)
		if rec.code == http.StatusMethodNotAllowed {
			allow := rec.header.Get("Allow")
			w.Header().Set("Allow", allow)
			writeJSON(w, http.StatusMethodNotAllowed, ErrorBody{
				Error: "method " + r.Method + " not allowed on " + r.URL.Path + "; allowed: " + allow,
			})
			return
		}
		writeJSON(w, http.StatusNotFound, ErrorBody{Error: "no such endpoint: " + r.Method + " " + r.URL.Path})
	})
}

// headerRecorder records the status and headers a handler writes and
// discards the body.
type headerRecorder struct {
	header http.Header
	code   int
}

func (s *headerRecorder) Header() http.Header { return s.header }

func (s *headerRecorder) WriteHeader(code int) {
	if s.code == 0 {
		s.code = code
	}
}

func (s *headerRecorder) Write(b []byte) (int, error) {
	s.WriteHeader(http.StatusOK)
	return len(b), nil
}

// acceptWS is websocket.Accept, but a refused handshake (not a WebSocket
// request, bad key or version, another site's Origin) is answered with the
// API's error shape rather than plain text: the status Accept chose (400,
// 403, 405 or 426) and {"error": <Accept's reason>, "field": <the request
// header it is about, or "">}.
func acceptWS(w http.ResponseWriter, r *http.Request, opts *websocket.AcceptOptions) (*websocket.Conn, error) {
	ew := &handshakeErrorWriter{ResponseWriter: w}
	c, err := websocket.Accept(ew, r, opts)
	if err != nil && ew.code != 0 {
		msg := strings.TrimSpace(ew.body.String())
		field := ""
		for _, m := range []struct{ in, field string }{
			{"Connection header", "Connection"},
			{"Upgrade header", "Upgrade"},
			{"protocol version", "Sec-WebSocket-Version"},
			{"Sec-WebSocket-Key", "Sec-WebSocket-Key"},
		} {
			if strings.Contains(msg, m.in) {
				field = m.field
				break
			}
		}
		if ew.code == http.StatusForbidden {
			field = "Origin"
		}
		writeJSON(w, ew.code, ErrorBody{Error: msg, Field: field})
	}
	return c, err
}

// handshakeErrorWriter holds back an error status (>= 400) and its body,
// and passes everything else, including the 101 and the hijack (through
// Unwrap), to the ResponseWriter.
type handshakeErrorWriter struct {
	http.ResponseWriter
	code int
	body bytes.Buffer
}

func (e *handshakeErrorWriter) WriteHeader(code int) {
	if code >= 400 {
		e.code = code
		return
	}
	e.ResponseWriter.WriteHeader(code)
}

func (e *handshakeErrorWriter) Write(b []byte) (int, error) {
	if e.code != 0 {
		return e.body.Write(b)
	}
	return e.ResponseWriter.Write(b)
}

// Unwrap returns the ResponseWriter, for http.ResponseController and
// websocket's hijack.
func (e *handshakeErrorWriter) Unwrap() http.ResponseWriter { return e.ResponseWriter }
