package telemetry_test

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxchat/outboxchat/chat/telemetry"
	"github.com/outboxchat/outboxchat/outbox"
)

func TestConfigured(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		env  []string
		want bool
	}{
		{"nothing", []string{"PATH=/bin", "HOME=/root"}, false},
		{"endpoint", []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318"}, true},
		{"service name only", []string{"OTEL_SERVICE_NAME=chat"}, true},
		{"disabled", []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://x", "OTEL_SDK_DISABLED=true"}, false},
		{"exporter none", []string{"OTEL_TRACES_EXPORTER=none", "OTEL_SERVICE_NAME=chat"}, false},
		{"not disabled", []string{"OTEL_SDK_DISABLED=false"}, true},
		{"prefix only in value", []string{"X=OTEL_"}, false},
	} {
		if got := telemetry.Configured(tc.env); got != tc.want {
			t.Errorf("%s: Configured = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestInjectExtract: the trace context goes into headers within the
// outbox's limits and comes back out as the same span context; off, no
// headers and no span.
func TestInjectExtract(t *testing.T) {
	t.Parallel()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(tracetest.NewInMemoryExporter()))
	tr := telemetry.New(tp)
	ctx, span := tr.Start(context.Background(), "x")
	defer span.End()
	h := tr.Inject(ctx)
	if err := outbox.CheckHeaders(h); err != nil || h[telemetry.Traceparent] == "" {
		t.Fatalf("Inject = %v (%v)", h, err)
	}
	back := tr.Extract(context.Background(), h)
	if got := tr.Traceparent(back); got != h[telemetry.Traceparent] {
		t.Fatalf("round trip: %q, want %q", got, h[telemetry.Traceparent])
	}
	if tr.Inject(context.Background()) != nil {
		t.Fatal("headers without a span")
	}
	// A send the sampler left out carries nothing downstream.
	never := telemetry.New(sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample())))
	uctx, uspan := never.Start(context.Background(), "x")
	defer uspan.End()
	if !uspan.SpanContext().IsValid() || never.Inject(uctx) != nil {
		t.Fatalf("unsampled span: valid %v, headers %v; want valid and none", uspan.SpanContext().IsValid(), never.Inject(uctx))
	}
	off := telemetry.New(nil)
	if off.Enabled() || off.Inject(ctx) != nil || off.Traceparent(ctx) != "" {
		t.Fatal("an off Tracer carries a trace context")
	}
	if c := off.Extract(context.Background(), h); c != context.Background() {
		t.Fatal("an off Tracer extracted a context")
	}
}

// TestFormatAndExtractTraceparent: FormatTraceparent writes what the W3C
// propagator writes, for sampled and unsampled spans; ExtractTraceparent
// and SpanContext read back the span context that Inject carried.
func TestFormatAndExtractTraceparent(t *testing.T) {
	t.Parallel()
	tr := telemetry.New(sdktrace.NewTracerProvider(sdktrace.WithSyncer(tracetest.NewInMemoryExporter())))
	ctx, span := tr.Start(context.Background(), "x")
	defer span.End()
	h := tr.Inject(ctx)
	if got := telemetry.FormatTraceparent(span.SpanContext()); got != h[telemetry.Traceparent] {
		t.Fatalf("FormatTraceparent = %q, propagator %q", got, h[telemetry.Traceparent])
	}
	never := telemetry.New(sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample())))
	_, uspan := never.Start(context.Background(), "x")
	defer uspan.End()
	sc := uspan.SpanContext()
	if got, want := telemetry.FormatTraceparent(sc), "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-00"; got != want {
		t.Fatalf("unsampled: FormatTraceparent = %q, want %q", got, want)
	}
	for name, got := range map[string]trace.SpanContext{
		"ExtractTraceparent": trace.SpanContextFromContext(tr.ExtractTraceparent(context.Background(), h[telemetry.Traceparent])),
		"SpanContext":        tr.SpanContext(h),
	} {
		if got.TraceID() != span.SpanContext().TraceID() || got.SpanID() != span.SpanContext().SpanID() || !got.IsSampled() || !got.IsRemote() {
			t.Errorf("%s = %v, want the remote, sampled context of %v", name, got, span.SpanContext())
		}
	}
	if tr.SpanContext(map[string]string{telemetry.Traceparent: "00-garbage"}).IsValid() || tr.SpanContext(nil).IsValid() {
		t.Error("a malformed or missing traceparent gave a valid span context")
	}
	if off := telemetry.New(nil); off.SpanContext(h).IsValid() || off.ExtractTraceparent(ctx, h[telemetry.Traceparent]) != ctx {
		t.Error("an off Tracer extracted a span context")
	}
}
