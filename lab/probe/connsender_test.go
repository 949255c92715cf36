package probe

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// The bench's hand-written HTTP/1.1 requests are what net/http servers
// parse: path, content type, body; a 201 gives the id, another status an
// error with the API's text while the connection stays open, and a
// connection the server closes is dialed again.
func TestConnSender(t *testing.T) {
	var conns, reqs atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := reqs.Add(1)
		data, _ := io.ReadAll(r.Body)
		var req struct{ Body string }
		if r.Method != http.MethodPost || r.URL.Path != "/api/chats/7/messages" ||
			r.Header.Get("Content-Type") != "application/json" || json.Unmarshal(data, &req) != nil {
			w.WriteHeader(http.StatusTeapot)
			return
		}
		switch {
		case req.Body == "bad":
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error": "body: nope", "field": "body"}`))
		case n == 3:
			w.Header().Set("Connection", "close") // the next send must redial
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"id": "id-close"}`))
		default:
			w.WriteHeader(http.StatusCreated)
			b, _ := json.Marshal(map[string]string{"id": "id-" + req.Body})
			_, _ = w.Write(b)
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	s, err := NewConnSender(srv.URL, "", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if id, err := s.Send(ctx, 7, "a \"quoted\" ü"); err != nil || id != `id-a "quoted" ü` {
		t.Fatalf("send = %q, %v", id, err)
	}
	if _, err := s.Send(ctx, 7, "bad"); err == nil || !errors.Is(err, errStatus) || !strings.Contains(err.Error(), "400 body: nope") {
		t.Fatalf("bad send error %v, want 400 with the API's text", err)
	}
	if id, err := s.Send(ctx, 7, "x"); err != nil || id != "id-close" {
		t.Fatalf("send = %q, %v", id, err)
	}
	if id, err := s.Send(ctx, 7, "y"); err != nil || id != "id-y" {
		t.Fatalf("send after the server closed = %q, %v", id, err)
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2 (kept alive, redialed once after Connection: close)", n)
	}
}
