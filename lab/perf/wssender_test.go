package perf

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/outboxchat/outboxchat/chat"
)

func TestScanAck(t *testing.T) {
	m := chat.Message{ID: "0193a2b4-0000-7000-8000-000000000001", ChatID: 3, Seq: 9, SentAt: time.Unix(1, 0)}
	ack := chat.AppendAckFrame(nil, "b1-1", m)
	for _, tc := range []struct {
		name  string
		frame []byte
		id    string
		want  string
		ok    bool
	}{
		{"the server's ack", ack, "b1-1", m.ID, true},
		{"another send's ack", chat.AppendAckFrame(nil, "b1-12", m), "b1-1", "", false},
		{"an error frame", chat.AppendErrorFrame(nil, "b1-1", "rate limited", ""), "b1-1", "", false},
		{"a message frame", m.AppendJSON(nil), "b1-1", "", false},
		{"another field order", []byte(`{"client_id":"b1-1","type":"ack","id":"x"}`), "b1-1", "", false},
		{"an escaped id", []byte(`{"type":"ack","client_id":"b1-1","id":"a\"b"}`), "b1-1", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := scanAck(tc.frame, tc.id)
			if got != tc.want || ok != tc.ok {
				t.Fatalf("scanAck(%s, %q) = %q, %v; want %q, %v", tc.frame, tc.id, got, ok, tc.want, tc.ok)
			}
		})
	}
}

// wsEcho serves /ws: each send frame is answered by the frames reply
// returns (none: no answer).
func wsEcho(t *testing.T, reply func(clientID string) [][]byte) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{chat.WSProtocol}})
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			_, data, err := c.Read(r.Context())
			if err != nil {
				return
			}
			f, err := chat.DecodeClientFrame(data, 1<<10)
			if err != nil {
				t.Errorf("server: %v", err)
				return
			}
			for _, b := range reply(f.ClientID) {
				if err := c.Write(r.Context(), websocket.MessageText, b); err != nil {
					return
				}
			}
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestWSSender(t *testing.T) {
	t.Parallel()
	m := chat.Message{ID: "0193a2b4-0000-7000-8000-000000000002", ChatID: 1, Seq: 1, SentAt: time.Unix(1, 0)}
	t.Run("the ack after a pushed message and another send's ack", func(t *testing.T) {
		t.Parallel()
		base := wsEcho(t, func(id string) [][]byte {
			return [][]byte{m.AppendJSON(nil), chat.AppendAckFrame(nil, "other", chat.Message{ID: "wrong"}), chat.AppendAckFrame(nil, id, m)}
		})
		s, err := newWSSender(base, "", 1, "t-", 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		for range 3 {
			id, err := s.Send(context.Background(), 1, "hi")
			if err != nil || id != m.ID {
				t.Fatalf("Send = %q, %v; want %q", id, err, m.ID)
			}
		}
	})
	t.Run("the bench's ctx ends a Send", func(t *testing.T) {
		t.Parallel()
		base := wsEcho(t, func(string) [][]byte { return nil })
		s, err := newWSSender(base, "", 1, "t-", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		if _, err := s.Send(ctx, 1, "hi"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Send with no ack = %v, want the ctx's end", err)
		}
	})
	t.Run("an error frame", func(t *testing.T) {
		t.Parallel()
		base := wsEcho(t, func(id string) [][]byte { return [][]byte{chat.AppendErrorFrame(nil, id, "slow down", "")} })
		s, err := newWSSender(base, "", 1, "t-", 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if _, err := s.Send(context.Background(), 1, "hi"); err == nil || err.Error() != "error frame: slow down" {
			t.Fatalf("Send = %v, want the error frame's text", err)
		}
	})
	t.Run("no ack within the timeout, then a redial", func(t *testing.T) {
		t.Parallel()
		acks := make(chan bool, 2)
		acks <- false
		acks <- true
		base := wsEcho(t, func(id string) [][]byte {
			if <-acks {
				return [][]byte{chat.AppendAckFrame(nil, id, m)}
			}
			return nil
		})
		s, err := newWSSender(base, "", 1, "t-", 200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		began := time.Now()
		_, err = s.Send(context.Background(), 1, "hi")
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Send without an ack = %v, want a timeout", err)
		}
		if d := time.Since(began); d > 5*time.Second {
			t.Fatalf("Send without an ack took %v, timeout 200ms", d)
		}
		if id, err := s.Send(context.Background(), 1, "hi"); err != nil || id != m.ID {
			t.Fatalf("Send after the timeout = %q, %v; want a new socket and %q", id, err, m.ID)
		}
	})
}
