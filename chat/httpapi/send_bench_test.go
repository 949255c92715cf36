package httpapi

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/chat"
)

// benchDeps answers every send with a stored message and nothing else.
type benchDeps struct{}

func (benchDeps) SendIdempotent(_ context.Context, chatID int64, body, _, author string) (chat.Message, bool, error) {
	return chat.Message{ID: "0193e8a0-7c1d-7b6e-9f00-1234567890ab", ChatID: chatID, Seq: 1234, Body: body,
		SentAt: time.Date(2026, 3, 4, 5, 6, 7, 891234000, time.UTC), From: chat.Consumers, Author: author}, false, nil
}

func (benchDeps) History(context.Context, int64, int64, int64, int) (chat.History, error) {
	return chat.History{}, nil
}

func (benchDeps) DeliveredUpTo(context.Context, int64) (int64, time.Time, error) {
	return 0, time.Time{}, nil
}

func (benchDeps) Follow(int64, int64, int64) (<-chan []byte, <-chan struct{}, func()) {
	return nil, nil, func() {}
}

// discardWriter is a ResponseWriter that keeps the status and the body's
// length only.
type discardWriter struct {
	h    http.Header
	code int
	n    int
}

func (d *discardWriter) Header() http.Header { return d.h }

func (d *discardWriter) WriteHeader(code int) { d.code = code }

func (d *discardWriter) Write(b []byte) (int, error) { d.n += len(b); return len(b), nil }

// BenchmarkSendHandler is one POST of a message through the API's handler
// chain (guard, routing, JSON errors, handleSend) with a Sender that stores
// nothing: the HTTP side's own CPU and allocations per send.
func BenchmarkSendHandler(b *testing.B) {
	deps := benchDeps{}
	a, err := New(Deps{Sender: deps, Reader: deps, Rooms: deps}, &Config{
		Service: chat.Consumers, ListenAddr: "127.0.0.1:8080", Logger: slog.New(slog.DiscardHandler),
		Guard: GuardConfig{UserRate: -1, IPRate: -1},
	})
	if err != nil {
		b.Fatal(err)
	}
	mux := http.NewServeMux()
	a.Register(mux)
	h := a.Handler(mux, nil)
	body := []byte(`{"body":"a message of some forty bytes, <b>bold</b>","client_id":"c-17-0001234"}`)
	req, err := http.NewRequest(http.MethodPost, "http://127.0.0.1:8080/api/chats/42/messages", nil)
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.RemoteAddr = "127.0.0.1:40000"
	req.ContentLength = int64(len(body))
	w := &discardWriter{}
	rd := bytes.NewReader(body)
	b.ReportAllocs()
	for b.Loop() {
		rd.Reset(body)
		r := *req
		r.Body = io.NopCloser(rd)
		w.h, w.code, w.n = http.Header{}, 0, 0
		h.ServeHTTP(w, &r)
		if w.code != http.StatusCreated || w.n == 0 {
			b.Fatalf("status %d, %d bytes", w.code, w.n)
		}
	}
	if !strings.Contains(w.h.Get("Content-Type"), "json") {
		b.Fatal("no JSON answer")
	}
}
