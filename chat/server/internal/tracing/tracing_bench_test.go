package tracing

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/telemetry"
	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/outbox"
)

// benchSender stands in for the store: it answers every send at once.
type benchSender struct{ seq int64 }

func (s *benchSender) SendIdempotent(_ context.Context, chatID int64, body, _, author string) (chat.Message, bool, error) {
	s.seq++
	return chat.Message{ID: "0193a4c2-7f00-7000-8000-" + strconv.FormatInt(100000000000+s.seq, 10), ChatID: chatID,
		Seq: s.seq, Body: body, Author: author}, false, nil
}

// BenchmarkTracedMessage is the tracing work of one message's way, both
// services' share in one process, with every span sampled and exported
// through the OTLP/HTTP exporter and batch span processor the serve command
// uses, to a loopback receiver that discards what it gets: the HTTP send's
// span, the header injection, the send transaction (group commits of 16),
// the relay's publish and the receiver's inbox store (batches of 100), and
// the gateway's push.
// What it reports per message (ns/op, B/op, allocs/op; one op is one
// message) is what tracing adds to the services' CPU.
//
// Sub-benchmarks: every message sampled (always_on), and one message in
// ten (parentbased_traceidratio 0.1), where most messages take the
// unsampled path that sampling in production (docs/OPERATING.md) makes
// the common one.
func BenchmarkTracedMessage(b *testing.B) {
	b.Run("always_on", func(b *testing.B) { benchTracedMessage(b, sdktrace.AlwaysSample()) })
	b.Run("ratio_0.1", func(b *testing.B) {
		benchTracedMessage(b, sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.1)))
	})
}

func benchTracedMessage(b *testing.B, sampler sdktrace.Sampler) {
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	defer sink.Close()
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(sink.URL+"/v1/traces"))
	if err != nil {
		b.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithSampler(sampler))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	t := telemetry.New(tp)
	sender := Sender(&benchSender{})
	sendTx := SendTx(t)
	var got chat.Message
	var hdr map[string]string
	// The group commit's sends: 16 senders' at a time, as in lab bench.
	const groupCommit = 16
	var group []context.Context
	handler := HTTPSend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m, _, err := sender.SendIdempotent(r.Context(), 7, "hello", "", "alice")
		if err != nil {
			b.Fatal(err)
		}
		got, hdr = m, t.Inject(r.Context())
		if group = append(group, r.Context()); len(group) == groupCommit {
			sendTx(group, time.Now(), nil)
			group = group[:0]
		}
		w.WriteHeader(http.StatusCreated)
	}))
	publish := Publisher(outbox.PublisherFunc(func(context.Context, []outbox.Message) error { return nil }), t)
	clock := &FetchClock{}
	clock.at.Store(time.Now().UnixNano())
	push := Push(t)
	req := httptest.NewRequest(http.MethodPost, "/api/chats/7/messages", nil)
	rec := httptest.NewRecorder()
	const batch = 100
	msgs := make([]outbox.Message, 0, batch)
	sent := make([]chat.Message, 0, batch)
	flush := func() {
		if err := publish.Publish(context.Background(), msgs); err != nil {
			b.Fatal(err)
		}
		applied := make([]inbox.Applied, len(sent))
		for i, m := range sent {
			applied[i] = inbox.Applied{Delivery: inbox.Delivery{ID: m.ID, Headers: msgs[i].Headers}, Value: m}
		}
		Applied(t, clock, applied)
		for i, m := range sent {
			// As the gateway: a push span only for a traced message.
			if m.TraceParent = msgs[i].Headers[telemetry.Traceparent]; m.TraceParent != "" {
				push(m, time.Now())
			}
		}
		msgs, sent = msgs[:0], sent[:0]
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		handler.ServeHTTP(rec, req)
		msgs = append(msgs, outbox.Message{RowID: int64(i), ID: got.ID, Event: "message.created", Headers: hdr})
		sent = append(sent, got)
		if len(msgs) == batch {
			flush()
		}
	}
	if len(msgs) > 0 {
		flush()
	}
	b.StopTimer()
	if err := tp.ForceFlush(context.Background()); err != nil {
		b.Fatal(err)
	}
}
