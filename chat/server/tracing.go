package server

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/httpapi"
	"github.com/outboxchat/outboxchat/chat/telemetry"
	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/outbox"
)

// The spans of a message's way, each wired around a part here so that the
// parts themselves know nothing of tracing (telemetry's package doc). They
// are installed only when the process's Tracer is enabled
// (Config.TracerProvider): off, none of these wrappers exists.
//
//	HTTP send (server span; its traceparent is the response's)
//	└ send transaction (its context goes into the outbox event's headers)
//	  └ relay publish (one per message; its context replaces the headers')
//	    ├ inbox store (the receiver's inbox commit)
//	    ├ gateway push (each subscriber a received message is queued to)
//	    └ relay publish of the receipt (the receiver's relay)
//	      └ receipt (the sender's inbox commit of the receipt)

// traceSend wraps the API's handler: a POST of a message gets a server
// span, and the response a traceparent header naming it (set before the
// handler writes). A traceparent on the request makes the span its child.
func (p *process) traceSend(next http.Handler) http.Handler {
	t := p.tracer
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || !isSendPath(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		ctx := t.Extract(r.Context(), map[string]string{telemetry.Traceparent: r.Header.Get(telemetry.Traceparent),
			"tracestate": r.Header.Get("tracestate")})
		ctx, span := t.Start(ctx, telemetry.SpanHTTPSend, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("http.request.method", r.Method), attribute.String("url.path", r.URL.Path),
				attribute.String(telemetry.AttrService, p.cfg.Service)))
		defer span.End()
		// Also when the sampler left the send out (flags 00): the caller
		// learns its trace id either way.
		sc := span.SpanContext()
		w.Header().Set(telemetry.Traceparent, "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-"+sc.TraceFlags().String())
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r.WithContext(ctx))
		span.SetAttributes(attribute.Int("http.response.status_code", sw.status))
		if sw.status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(sw.status))
		}
	})
}

// isSendPath reports whether path is /api/chats/{chat_id}/messages.
func isSendPath(path string) bool {
	rest, ok := strings.CutPrefix(path, "/api/chats/")
	if !ok {
		return false
	}
	id, tail, ok := strings.Cut(rest, "/")
	return ok && id != "" && tail == "messages"
}

// statusWriter records the status code a handler wrote.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the connection (the WebSocket
// upgrade does not pass here, but flushes might).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// tracedSender is the send transaction's span around the store.
type tracedSender struct {
	next    httpapi.Sender
	t       *telemetry.Tracer
	service string
}

func (s tracedSender) SendIdempotent(ctx context.Context, chatID int64, body, key, author string) (chat.Message, bool, error) {
	ctx, span := s.t.Start(ctx, telemetry.SpanSendTx, trace.WithAttributes(
		attribute.Int64(telemetry.AttrChatID, chatID), attribute.String(telemetry.AttrService, s.service)))
	defer span.End()
	m, replayed, err := s.next.SendIdempotent(ctx, chatID, body, key, author)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "send failed")
		return m, replayed, err
	}
	span.SetAttributes(attribute.String(telemetry.AttrMessageID, m.ID), attribute.Int64(telemetry.AttrSeq, m.Seq),
		attribute.Bool("chat.replayed", replayed))
	return m, replayed, nil
}

var _ httpapi.Sender = tracedSender{}

// tracedPublisher gives every published message that carries a trace
// context a relay publish span, child of that context, and hands the
// message on with its headers' trace context replaced by the span's, so
// that the receiver's spans are children of the publish.
func tracedPublisher(next outbox.Publisher, t *telemetry.Tracer, service string) outbox.Publisher {
	return outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) error {
		var spans []trace.Span
		out := msgs
		for i, m := range msgs {
			if m.Headers[telemetry.Traceparent] == "" {
				continue
			}
			if spans == nil {
				out = append([]outbox.Message(nil), msgs...) // the relay may retry msgs: leave them as they are
			}
			sctx, span := t.Start(t.Extract(ctx, m.Headers), telemetry.SpanRelayPublish,
				trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(
					attribute.String(telemetry.AttrMessageID, m.ID), attribute.String("messaging.operation.name", m.Event),
					attribute.String(telemetry.AttrService, service)))
			spans = append(spans, span)
			h := make(map[string]string, len(m.Headers))
			for k, v := range m.Headers {
				h[k] = v
			}
			for k, v := range t.Inject(sctx) {
				h[k] = v
			}
			out[i].Headers = h
		}
		err := next.Publish(ctx, out)
		for _, span := range spans {
			if err != nil {
				span.RecordError(err)
				span.SetStatus(codes.Error, "publish failed")
			}
			span.End()
		}
		return err
	})
}

// fetchClock wraps the worker's Source to note when its latest Fetch
// returned: the start of the inbox store spans of that batch (the inbox
// consumer fetches, applies, commits and calls AfterCommit on one
// goroutine, so the batch committed is the one fetched last).
type fetchClock struct {
	inbox.Source
	at atomic.Int64 // unix ns
}

func (f *fetchClock) Fetch(ctx context.Context, max int) ([]inbox.Delivery, error) {
	ds, err := f.Source.Fetch(ctx, max)
	if len(ds) > 0 {
		f.at.Store(time.Now().UnixNano())
	}
	return ds, err
}

// traceApplied records, for each delivery of a committed inbox batch that
// carries a trace context, an inbox store span (a message) or a receipt
// span (a receipt), from the batch's fetch to now.
func traceApplied(t *telemetry.Tracer, clock *fetchClock, service string, applied []inbox.Applied) {
	began := time.Unix(0, clock.at.Load())
	for _, a := range applied {
		if a.Delivery.Headers[telemetry.Traceparent] == "" {
			continue
		}
		ctx := t.Extract(context.Background(), a.Delivery.Headers)
		name := telemetry.SpanInboxStore
		attrs := []attribute.KeyValue{attribute.String(telemetry.AttrMessageID, a.Delivery.ID),
			attribute.String(telemetry.AttrService, service)}
		switch v := a.Value.(type) {
		case chat.Receipt:
			name = telemetry.SpanReceipt
			if len(v.Chats) > 0 {
				attrs = append(attrs, attribute.Int64(telemetry.AttrChatID, v.Chats[0].ChatID),
					attribute.Int64("chat.receipt.upto_seq", v.Chats[0].UptoSeq), attribute.Int("chat.receipt.chats", len(v.Chats)))
			}
		case chat.Message:
			attrs = append(attrs, attribute.Int64(telemetry.AttrChatID, v.ChatID), attribute.Int64(telemetry.AttrSeq, v.Seq))
		}
		_, span := t.Start(ctx, name, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithTimestamp(began),
			trace.WithAttributes(attrs...))
		span.End()
	}
}

// tracePush is the gateway's OnPush: a gateway push span, child of the
// message's trace context, from the push's start to its frame being
// queued.
func tracePush(t *telemetry.Tracer, service string) func(chat.Message, time.Time) {
	return func(m chat.Message, began time.Time) {
		ctx := t.Extract(context.Background(), telemetry.Headers(m.TraceParent))
		_, span := t.Start(ctx, telemetry.SpanGatewayPush, trace.WithTimestamp(began), trace.WithAttributes(
			attribute.String(telemetry.AttrMessageID, m.ID), attribute.Int64(telemetry.AttrChatID, m.ChatID),
			attribute.Int64(telemetry.AttrSeq, m.Seq), attribute.String(telemetry.AttrService, service)))
		span.End()
	}
}
