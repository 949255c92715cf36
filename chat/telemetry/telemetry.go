// Package telemetry is the chat's OpenTelemetry tracing: a Tracer built
// from the standard OTEL_* environment variables (off when none is set),
// and the W3C trace context carried in event headers (outbox.Event.Headers
// → redisq stream entry → inbox.Delivery.Headers) from the send to the
// other service's WebSocket push and back with the receipt.
//
// The library (outbox, redisq, inbox) knows nothing of OpenTelemetry: it
// carries the headers as a plain map. This package turns a context into
// headers (Inject) and headers into a context (Extract); chat/server wires
// the spans around the library's parts.
//
// A Tracer that is off (New(nil), or FromEnv with no OTEL_* variable set)
// reports Enabled false and the server then installs none of its wrappers:
// no span, no header, no allocation on the hot path.
package telemetry

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Span names, one per stage of a message's way (see docs/OPERATING.md).
const (
	SpanHTTPSend      = "POST /api/chats/{chat_id}/messages"
	SpanSendTx        = "chat.send_tx"
	SpanRelayPublish  = "outbox.relay publish"
	SpanInboxStore    = "inbox.store"
	SpanReceipt       = "chat.receipt"
	SpanGatewayPush   = "gateway.push"
	instrumentation   = "github.com/outboxchat/outboxchat/chat"
	traceparentHeader = "traceparent"
)

// Attribute keys set on the spans.
const (
	AttrMessageID = "messaging.message.id"
	AttrChatID    = "chat.id"
	AttrSeq       = "chat.seq"
)

// Tracer starts the chat's spans and moves the trace context in and out of
// event headers. The zero value and a nil *Tracer are off. Safe for
// concurrent use.
type Tracer struct {
	t    trace.Tracer
	prop propagation.TextMapPropagator
}

// New returns a Tracer on tp; nil tp gives a Tracer that is off. The
// propagator is W3C trace context (traceparent, tracestate).
func New(tp trace.TracerProvider) *Tracer {
	if tp == nil {
		return &Tracer{}
	}
	return &Tracer{t: tp.Tracer(instrumentation), prop: propagation.TraceContext{}}
}

// Enabled reports whether the Tracer records spans.
func (t *Tracer) Enabled() bool { return t != nil && t.t != nil }

// Start starts a span named name as a child of ctx's span (or of nothing).
// Off, it returns ctx and a no-op span.
func (t *Tracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if !t.Enabled() {
		return ctx, trace.SpanFromContext(context.Background())
	}
	return t.t.Start(ctx, name, opts...)
}

// Inject returns the headers that carry ctx's span context
// ({"traceparent": "00-…", "tracestate": …}), or nil when the Tracer is off
// or ctx holds no valid, sampled span context. An unsampled context is not
// carried: none of the spans after it would be recorded, so a message the
// sampler left out costs no header on its way (with
// OTEL_TRACES_SAMPLER=parentbased_traceidratio, only the sampled share of
// the messages pays for tracing). Within outbox.CheckHeaders' limits (a
// tracestate is at most 512 bytes).
func (t *Tracer) Inject(ctx context.Context) map[string]string {
	if sc := trace.SpanContextFromContext(ctx); !t.Enabled() || !sc.IsValid() || !sc.IsSampled() {
		return nil
	}
	h := map[string]string{}
	t.prop.Inject(ctx, propagation.MapCarrier(h))
	if len(h) == 0 {
		return nil
	}
	return h
}

// Extract returns ctx with the remote span context that headers carry (as
// Inject wrote them), or ctx itself when the Tracer is off or headers carry
// none (or a malformed one).
func (t *Tracer) Extract(ctx context.Context, headers map[string]string) context.Context {
	if !t.Enabled() || headers[traceparentHeader] == "" {
		return ctx
	}
	return t.prop.Extract(ctx, propagation.MapCarrier(headers))
}

// Traceparent returns the W3C traceparent of ctx's span ("" when off or
// none).
func (t *Tracer) Traceparent(ctx context.Context) string {
	return t.Inject(ctx)[traceparentHeader]
}

// SpanContext returns the remote span context that headers carry (as
// Inject wrote them): invalid when the Tracer is off or headers carry none
// (or a malformed one).
func (t *Tracer) SpanContext(headers map[string]string) trace.SpanContext {
	if !t.Enabled() || headers[traceparentHeader] == "" {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(t.prop.Extract(context.Background(), propagation.MapCarrier(headers)))
}

// ExtractTraceparent is Extract of headers holding traceparent alone,
// without building them: what the receiver keeps of a message's headers
// (Headers) is enough to continue its trace.
func (t *Tracer) ExtractTraceparent(ctx context.Context, traceparent string) context.Context {
	if !t.Enabled() || traceparent == "" {
		return ctx
	}
	return t.prop.Extract(ctx, traceparentCarrier(traceparent))
}

// traceparentCarrier is a propagation.TextMapCarrier holding one
// traceparent and nothing else; Set is ignored.
type traceparentCarrier string

func (c traceparentCarrier) Get(key string) string {
	if key == traceparentHeader {
		return string(c)
	}
	return ""
}

func (traceparentCarrier) Set(string, string) {}

func (traceparentCarrier) Keys() []string { return []string{traceparentHeader} }

// FormatTraceparent returns sc as a W3C traceparent of version 00
// ("00-<trace id>-<span id>-<flags>", 55 bytes, lower-case hex), whether or
// not sc is valid or sampled; it allocates the string alone. It is what
// the propagator writes for a valid span context.
func FormatTraceparent(sc trace.SpanContext) string {
	var b [55]byte
	tid, sid := sc.TraceID(), sc.SpanID()
	b[0], b[1], b[2] = '0', '0', '-'
	hex.Encode(b[3:35], tid[:])
	b[35] = '-'
	hex.Encode(b[36:52], sid[:])
	b[52] = '-'
	hex.Encode(b[53:55], []byte{byte(sc.TraceFlags())})
	return string(b[:])
}

// Headers returns the W3C traceparent header alone as event headers (nil
// for ""): what the inbox keeps of a message's headers.
func Headers(traceparent string) map[string]string {
	if traceparent == "" {
		return nil
	}
	return map[string]string{traceparentHeader: traceparent}
}

// Traceparent is the header key of the W3C trace context.
const Traceparent = traceparentHeader

// Configured reports whether the environment configures tracing: some
// OTEL_* variable is set, OTEL_SDK_DISABLED is not "true" and
// OTEL_TRACES_EXPORTER is not "none". environ is os.Environ() but for
// tests.
func Configured(environ []string) bool {
	set := false
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(k, "OTEL_") {
			continue
		}
		set = true
		switch {
		case k == "OTEL_SDK_DISABLED" && strings.EqualFold(strings.TrimSpace(v), "true"):
			return false
		case k == "OTEL_TRACES_EXPORTER" && strings.EqualFold(strings.TrimSpace(v), "none"):
			return false
		}
	}
	return set
}

// FromEnv builds the process's TracerProvider from the standard OTEL_*
// environment variables, or returns nil (tracing off, shutdown a no-op)
// when Configured(os.Environ()) is false. On, spans go through a batch span
// processor (OTEL_BSP_*) to an OTLP/HTTP exporter (OTEL_EXPORTER_OTLP_*,
// OTEL_EXPORTER_OTLP_TRACES_*; default endpoint http://localhost:4318), with
// the sampler of OTEL_TRACES_SAMPLER (default parentbased_always_on) and a
// resource from OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
// (service.name defaults to "outboxchat-<service>"). OTEL_TRACES_EXPORTER
// may only be "otlp" or "none" (an error otherwise), and
// OTEL_EXPORTER_OTLP_PROTOCOL only "http/protobuf". shutdown flushes the
// spans still buffered and stops the exporter; call it once, with a
// deadline, after the server has stopped.
func FromEnv(ctx context.Context, service string) (tp *sdktrace.TracerProvider, shutdown func(context.Context) error, err error) {
	noop := func(context.Context) error { return nil }
	if !Configured(os.Environ()) {
		return nil, noop, nil
	}
	if e := os.Getenv("OTEL_TRACES_EXPORTER"); e != "" && e != "otlp" {
		return nil, noop, fmt.Errorf("telemetry: OTEL_TRACES_EXPORTER %q: only otlp (or none) is supported", e)
	}
	for _, k := range []string{"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"} {
		if p := os.Getenv(k); p != "" && p != "http/protobuf" {
			return nil, noop, fmt.Errorf("telemetry: %s %q: only http/protobuf is supported", k, p)
		}
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, noop, fmt.Errorf("telemetry: OTLP exporter: %w", err)
	}
	res, err := resource.Merge(
		resource.NewSchemaless(semconv.ServiceName("outboxchat-"+service)),
		resource.Environment())
	if err != nil {
		return nil, noop, fmt.Errorf("telemetry: resource: %w", err)
	}
	tp = sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return tp, tp.Shutdown, nil
}

// ShutdownTimeout bounds the final flush of FromEnv's shutdown that the
// serve command runs.
const ShutdownTimeout = 5 * time.Second
