package server

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/chat/telemetry"
	"github.com/outboxchat/outboxchat/internal/testenv"
)

// postTraced sends one message to chat on base and returns it with the
// response's traceparent header.
func postTraced(t *testing.T, base string, chatID int64, body string) (chat.Message, string) {
	t.Helper()
	resp, err := chattest.AuthClient.Post(fmt.Sprintf("%s/api/chats/%d/messages", base, chatID), "application/json",
		strings.NewReader(`{"body":`+chattest.JSONString(body)+`}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("send: %d %s", resp.StatusCode, raw)
	}
	var m chat.Message
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("decode %s: %v", raw, err)
	}
	return m, resp.Header.Get("traceparent")
}

// TestTraceFollowsAMessageBothWays: with tracing on, one send's trace
// holds every stage on both services, each the child of the one before
// (the context travels in the event headers, out with the message and back
// with its receipt), and the send's response names the HTTP span in its
// traceparent.
func TestTraceFollowsAMessageBothWays(t *testing.T) {
	t.Parallel()
	// One exporter, a provider per service: each span's resource names the
	// service that recorded it, as serve's own provider does.
	exp := tracetest.NewInMemoryExporter()
	on := func(c *Config) {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp),
			sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName(c.Service))))
		t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		c.TracerProvider = tp
	}
	h := newHarness(t, "")
	cons, work := h.start(chat.Consumers, on), h.start(chat.Workers, on)
	w := chattest.Watch(t, work.base, 7)
	m, tpHeader := postTraced(t, cons.base, 7, "traced")
	w.WaitSeqs(t, chat.Consumers, 1, 10*time.Second)

	parts := strings.Split(tpHeader, "-")
	if len(parts) != 4 || len(parts[1]) != 32 || len(parts[2]) != 16 {
		t.Fatalf("response traceparent %q is not a W3C traceparent", tpHeader)
	}
	traceID := parts[1]
	// The stages: the message's own spans are the send's children; each
	// batch it rode in is a span linked to the send (relation "link").
	type stage struct{ name, relation, service string }
	want := []stage{
		{telemetry.SpanGatewayPush, "child", chat.Workers},
		{telemetry.SpanReceipt, "child", chat.Consumers}, // recorded by the receipt's addressee
		{telemetry.SpanSendTx, "link", chat.Consumers},
		{telemetry.SpanRelayPublish, "link", chat.Consumers},
		{telemetry.SpanInboxStore, "link", chat.Workers},
		{telemetry.SpanRelayPublish, "link", chat.Workers}, // the receipt's
	}
	var spans tracetest.SpanStubs
	var send tracetest.SpanStub // the HTTP send's span
	find := func(s stage) bool {
		for _, sp := range spans {
			if sp.Name != s.name || spanService(sp) != s.service {
				continue
			}
			switch s.relation {
			case "child":
				if sp.SpanContext.TraceID() == send.SpanContext.TraceID() && sp.Parent.SpanID() == send.SpanContext.SpanID() {
					return true
				}
			case "link":
				for _, l := range sp.Links {
					if l.SpanContext.TraceID() == send.SpanContext.TraceID() && l.SpanContext.SpanID() == send.SpanContext.SpanID() {
						return true
					}
				}
			}
		}
		return false
	}
	var missing []stage
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("stages missing: %v; spans: %d", missing, len(spans))
			for _, sp := range spans {
				t.Logf("  %s %s trace %s parent %s links %d", spanService(sp), sp.Name, sp.SpanContext.TraceID(), sp.Parent.SpanID(), len(sp.Links))
			}
		}
	})
	testenv.WaitFor(t, 15*time.Second, "every stage of the message's trace", func() bool {
		spans = exp.GetSpans()
		for _, sp := range spans {
			if sp.Name == telemetry.SpanHTTPSend && sp.SpanContext.TraceID().String() == traceID {
				send = sp
			}
		}
		if !send.SpanContext.IsValid() {
			return false
		}
		missing = missing[:0]
		for _, s := range want {
			if !find(s) {
				missing = append(missing, s)
			}
		}
		return len(missing) == 0
	})
	if send.Parent.IsValid() || spanService(send) != chat.Consumers {
		t.Errorf("send span: parent %v, service %q; want a root span of %s", send.Parent, spanService(send), chat.Consumers)
	}
	if send.SpanContext.SpanID().String() != parts[2] {
		t.Errorf("response traceparent names span %s, the HTTP span is %s", parts[2], send.SpanContext.SpanID())
	}
	if got := attr(send, telemetry.AttrMessageID); got != m.ID {
		t.Errorf("send span has message id %q, want %s", got, m.ID)
	}
	// The receiver kept the traceparent with the row (for a gateway in
	// another process).
	if n := h.Count(t, `SELECT count(*) FROM workers.inbox WHERE message_id = $1 AND traceparent LIKE $2`, m.ID, "00-"+traceID+"-%"); n != 1 {
		t.Errorf("workers.inbox row of %s has no traceparent of trace %s", m.ID, traceID)
	}
}

// spanService is the service.name of the resource that recorded s.
func spanService(s tracetest.SpanStub) string {
	v, _ := s.Resource.Set().Value(semconv.ServiceNameKey)
	return v.AsString()
}

func attr(s tracetest.SpanStub, key string) string {
	for _, a := range s.Attributes {
		if string(a.Key) == key {
			return a.Value.AsString()
		}
	}
	return ""
}

// TestTracingOffLeavesNoTrace: without a TracerProvider nothing carries a
// trace context: no traceparent on the response, no headers on the outbox
// row, none kept in the inbox.
func TestTracingOffLeavesNoTrace(t *testing.T) {
	t.Parallel()
	h, cons, work := startBoth(t)
	w := chattest.Watch(t, work.base, 3)
	// A traceparent on the request is not taken up either.
	req, _ := http.NewRequest(http.MethodPost, cons.base+"/api/chats/3/messages", strings.NewReader(`{"body":"plain"}`))
	req.Header.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	req.Header.Set("Content-Type", "application/json")
	resp, err := chattest.AuthClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || resp.Header.Get("traceparent") != "" {
		t.Fatalf("status %d, traceparent %q; want 201 and none", resp.StatusCode, resp.Header.Get("traceparent"))
	}
	w.WaitSeqs(t, chat.Consumers, 1, 10*time.Second)
	if n := h.Count(t, `SELECT count(*) FROM workers.inbox WHERE traceparent IS NOT NULL`); n != 0 {
		t.Fatalf("%d inbox rows with a traceparent", n)
	}
}

// TestUnsampledSendLeavesNoSpan: a send the sampler leaves out records no
// span anywhere, though the receiver samples everything it starts: the
// message carries no trace context, so the workers' gateway push starts no
// trace of its own for it, and the response still names the trace (flags
// 00).
func TestUnsampledSendLeavesNoSpan(t *testing.T) {
	t.Parallel()
	consExp, workExp := tracetest.NewInMemoryExporter(), tracetest.NewInMemoryExporter()
	with := func(exp *tracetest.InMemoryExporter, s sdktrace.Sampler) func(*Config) {
		return func(c *Config) {
			tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSampler(s))
			t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			c.TracerProvider = tp
		}
	}
	h := newHarness(t, "")
	cons := h.start(chat.Consumers, with(consExp, sdktrace.ParentBased(sdktrace.NeverSample())))
	work := h.start(chat.Workers, with(workExp, sdktrace.AlwaysSample()))
	w := chattest.Watch(t, work.base, 11)
	m, tp := postTraced(t, cons.base, 11, "left out")
	if !strings.HasPrefix(tp, "00-") || !strings.HasSuffix(tp, "-00") {
		t.Fatalf("response traceparent %q: want one with flags 00 (not sampled)", tp)
	}
	w.WaitSeqs(t, chat.Consumers, 1, 10*time.Second)
	if n := h.Count(t, `SELECT count(*) FROM workers.inbox WHERE message_id = $1 AND traceparent IS NULL`, m.ID); n != 1 {
		t.Fatalf("the unsampled message's inbox row carries a traceparent")
	}
	for _, sp := range append(consExp.GetSpans(), workExp.GetSpans()...) {
		if sp.Name == telemetry.SpanGatewayPush || sp.Name == telemetry.SpanHTTPSend {
			t.Errorf("span %s (trace %s) recorded for an unsampled send", sp.Name, sp.SpanContext.TraceID())
		}
	}
}

// otlpReceiver is a minimal OTLP/HTTP trace endpoint: it decodes each
// export request (protobuf, possibly gzip) and keeps the spans' names by
// trace id, their own and the ones they link to.
type otlpReceiver struct {
	mu    sync.Mutex
	spans map[string][]string // trace id (hex) → names of its spans and of the spans linked to it
	bad   []string
}

func (o *otlpReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	raw, err := io.ReadAll(body)
	var req coltracepb.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(raw, &req)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" || err != nil {
		o.bad = append(o.bad, fmt.Sprintf("%s %s %s: %v", r.Method, r.URL.Path, r.Header.Get("Content-Type"), err))
		http.Error(w, "bad export", http.StatusBadRequest)
		return
	}
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			for _, sp := range ss.Spans {
				id := hex.EncodeToString(sp.TraceId)
				o.spans[id] = append(o.spans[id], sp.Name)
				for _, l := range sp.Links { // a batch's span, under each trace it carried
					if lid := hex.EncodeToString(l.TraceId); lid != id {
						o.spans[lid] = append(o.spans[lid], sp.Name)
					}
				}
			}
		}
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	_, _ = io.Copy(w, bytes.NewReader(out))
}

func (o *otlpReceiver) names(traceID string) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.spans[traceID]...)
}

// TestTracesExportOverOTLPHTTP: configured by the standard variables
// alone (telemetry.FromEnv), the services export their spans to a real
// OTLP/HTTP endpoint, which receives the message's trace from the send to
// the other side's push. (Not parallel: t.Setenv.)
func TestTracesExportOverOTLPHTTP(t *testing.T) {
	recv := &otlpReceiver{spans: map[string][]string{}}
	srv := httptest.NewServer(recv)
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
	t.Setenv("OTEL_SERVICE_NAME", "outboxchat-test")
	ctx := context.Background()
	h := newHarness(t, "")
	var cons, work *running
	for _, svc := range []string{chat.Consumers, chat.Workers} {
		tp, shutdown, err := telemetry.FromEnv(ctx, svc)
		if err != nil || tp == nil {
			t.Fatalf("FromEnv = %v, %v; want a provider", tp, err)
		}
		t.Cleanup(func() { _ = shutdown(context.Background()) })
		r := h.start(svc, func(c *Config) { c.TracerProvider = tp })
		if svc == chat.Consumers {
			cons = r
		} else {
			work = r
		}
	}
	w := chattest.Watch(t, work.base, 9)
	_, tpHeader := postTraced(t, cons.base, 9, "exported")
	w.WaitSeqs(t, chat.Consumers, 1, 10*time.Second)
	traceID := strings.Split(tpHeader, "-")[1]
	testenv.WaitFor(t, 15*time.Second, "the send's and the push's spans at the OTLP endpoint", func() bool {
		got := strings.Join(recv.names(traceID), ",")
		for _, n := range []string{telemetry.SpanHTTPSend, telemetry.SpanSendTx, telemetry.SpanRelayPublish,
			telemetry.SpanInboxStore, telemetry.SpanGatewayPush} {
			if !strings.Contains(got, n) {
				return false
			}
		}
		return true
	})
	recv.mu.Lock()
	defer recv.mu.Unlock()
	if len(recv.bad) > 0 {
		t.Fatalf("bad export requests: %v", recv.bad)
	}
}
