package metrics

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/inbox"
)

// BenchmarkE2EObserve is the per-message cost of outboxchat_e2e_seconds on
// the worker's after-commit path: one observation per stored message, from
// times the inbox insert already returned (ns/op is per message).
func BenchmarkE2EObserve(b *testing.B) {
	observe := (&Set{reg: prometheus.NewRegistry()}).E2E()
	sent := time.Now()
	recv := sent.Add(3 * time.Millisecond)
	batch := make([]inbox.Applied, 100)
	for i := range batch {
		batch[i].Value = chat.Message{ID: "m", ChatID: 1, Seq: int64(i + 1), SentAt: sent, ReceivedAt: &recv}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += len(batch) {
		observe(batch)
	}
}

// BenchmarkWSFrameCount is the per-frame cost of outboxchat_ws_frames_total.
func BenchmarkWSFrameCount(b *testing.B) {
	m := (&Set{reg: prometheus.NewRegistry()}).Sockets()
	b.ReportAllocs()
	for b.Loop() {
		m.FrameOut()
	}
}

// BenchmarkInstrument is the per-request cost of Instrument (the counter and
// the duration histogram by route) around a handler that answers 201.
func BenchmarkInstrument(b *testing.B) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/chats/{chat_id}/messages", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})
	h := (&Set{reg: prometheus.NewRegistry()}).Instrument(mux)
	req := httptest.NewRequest(http.MethodPost, "/api/chats/42/messages", nil)
	w := httptest.NewRecorder()
	b.ReportAllocs()
	for b.Loop() {
		r := *req
		h.ServeHTTP(w, &r)
	}
	if w.Code != http.StatusCreated {
		b.Fatalf("status %d", w.Code)
	}
}
