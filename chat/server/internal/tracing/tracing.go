// Package tracing wires the spans of a message's way around the parts of
// a service process, so that the parts themselves know nothing of tracing
// (chat/telemetry's package doc). The server installs these wrappers only
// when the process's Tracer is enabled (Config.TracerProvider): off, none
// of them exists.
package tracing

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

// A message's own trace holds the spans that are the message's alone; the
// batch operations it rides in (a group commit, a relay pass, an inbox
// batch) are one span each, linked to every message they carry, as
// OpenTelemetry's messaging conventions model batches. Every message of a
// batch shares its start and end, so a span per message would repeat them,
// and the SDK's and exporter's cost is per span.
//
//	HTTP send (server span; its traceparent is the response's, its
//	│          context goes into the outbox event's headers)
//	├ gateway push (each subscriber a received message is queued to)
//	└ receipt (the sender's inbox commit of the receipt)
//
//	linked to the send: send transaction (a group commit), relay publish
//	(a relay pass, on each side: the message's and its receipt's), inbox
//	store (an inbox batch)

// HTTPSend wraps the API's handler: a POST of a message
// (/api/chats/{chat_id}/messages) gets a server span of t, and the
// response a traceparent header naming it (set before the handler writes).
// A traceparent on the request makes the span its child. Other requests
// pass untouched.
func HTTPSend(t *telemetry.Tracer, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || !isSendPath(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		ctx := r.Context()
		if tp := r.Header.Get(telemetry.Traceparent); tp != "" {
			ctx = t.Extract(ctx, map[string]string{telemetry.Traceparent: tp, "tracestate": r.Header.Get("tracestate")})
		}
		// The process's resource names the service: no attribute for it.
		ctx, span := t.Start(ctx, telemetry.SpanHTTPSend, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("http.request.method", r.Method), attribute.String("url.path", r.URL.Path)))
		defer span.End()
		// Also when the sampler left the send out (flags 00): the caller
		// learns its trace id either way.
		w.Header().Set(telemetry.Traceparent, telemetry.FormatTraceparent(span.SpanContext()))
		if !span.IsRecording() {
			// Left out: nothing after this records a span or carries a
			// header for it (Inject), so the request goes on untouched and
			// the unsampled majority pays for the header alone.
			next.ServeHTTP(w, r)
			return
		}
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

// Sender wraps next so that each send names the message it stored on the
// send's span (the HTTP send's, from its ctx): its id, chat and seq. The
// send transaction has a span of its own per group commit (SendTx). Safe
// for concurrent use when next is.
func Sender(next httpapi.Sender) httpapi.Sender { return tracedSender{next: next} }

// tracedSender is Sender's wrapper.
type tracedSender struct {
	next httpapi.Sender
}

func (s tracedSender) SendIdempotent(ctx context.Context, chatID int64, body, key, author string) (chat.Message, bool, error) {
	m, replayed, err := s.next.SendIdempotent(ctx, chatID, body, key, author)
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return m, replayed, err
	}
	if err != nil {
		span.SetAttributes(attribute.Int64(telemetry.AttrChatID, chatID))
		return m, replayed, err
	}
	span.SetAttributes(attribute.String(telemetry.AttrMessageID, m.ID), attribute.Int64(telemetry.AttrChatID, chatID),
		attribute.Int64(telemetry.AttrSeq, m.Seq))
	if replayed {
		span.SetAttributes(attribute.Bool("chat.replayed", true))
	}
	return m, replayed, nil
}

// SendTx is the store's OnBatch (store.Config.OnBatch): one send
// transaction span per group commit, from began to now, linked to the span
// of each sampled send it carried (a batch operation, as the relay's
// publish: Publisher), with err as its error.
func SendTx(t *telemetry.Tracer) func([]context.Context, time.Time, error) {
	return func(ctxs []context.Context, began time.Time, err error) {
		links := make([]trace.Link, 0, len(ctxs))
		for _, ctx := range ctxs {
			if sc := trace.SpanContextFromContext(ctx); sc.IsValid() && sc.IsSampled() {
				links = append(links, trace.Link{SpanContext: sc})
			}
		}
		batchSpans(t, context.Background(), telemetry.SpanSendTx, trace.SpanKindInternal, began, links, err,
			attribute.Int("chat.batch.sends", len(ctxs)))
	}
}

var _ httpapi.Sender = tracedSender{}

// Publisher wraps the relay's publisher: it records one relay publish span per published batch that
// holds a traced message (more than maxLinks of them: one span per
// maxLinks), linked to each traced message's context, as OpenTelemetry's
// messaging conventions model a batch send: every message of a batch shares
// the publish's start and end, so a span of its own per message would only
// repeat them. The messages go on with their headers untouched: the
// receiver's spans continue the context of the send.
func Publisher(next outbox.Publisher, t *telemetry.Tracer) outbox.Publisher {
	return outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) error {
		var links []trace.Link
		for _, m := range msgs {
			if sc := t.SpanContext(m.Headers); sc.IsValid() {
				links = append(links, trace.Link{SpanContext: sc})
			}
		}
		if links == nil {
			return next.Publish(ctx, msgs)
		}
		began := time.Now()
		err := next.Publish(ctx, msgs)
		batchSpans(t, ctx, telemetry.SpanRelayPublish, trace.SpanKindProducer, began, links, err,
			attribute.Int("messaging.batch.message_count", len(msgs)))
		return err
	})
}

// maxLinks is the most links one batch span carries: the SDK's default
// link count limit (OTEL_SPAN_LINK_COUNT_LIMIT, 128), above which it would
// drop them.
const maxLinks = 128

// batchSpans records, for a batch operation that began at began and ends
// now, spans named name linked to links, at most maxLinks each, as children
// of ctx's span (if any), with the error err (nil: none) and attrs.
func batchSpans(t *telemetry.Tracer, ctx context.Context, name string, kind trace.SpanKind, began time.Time,
	links []trace.Link, err error, attrs ...attribute.KeyValue) {
	for len(links) > 0 {
		n := min(len(links), maxLinks)
		_, span := t.Start(ctx, name, trace.WithSpanKind(kind), trace.WithTimestamp(began),
			trace.WithLinks(links[:n]...), trace.WithAttributes(attrs...))
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, "failed")
		}
		span.End()
		links = links[n:]
	}
}

// FetchClock wraps the worker's Source to note when its latest Fetch
// returned: the start of the inbox store spans of that batch (Applied; the
// inbox consumer fetches, applies, commits and calls AfterCommit on one
// goroutine, so the batch committed is the one fetched last). Safe for
// concurrent use when the Source is.
type FetchClock struct {
	inbox.Source
	at atomic.Int64 // unix ns
}

// NewFetchClock wraps src.
func NewFetchClock(src inbox.Source) *FetchClock { return &FetchClock{Source: src} }

// Fetch is the Source's Fetch, noting the time when it returned deliveries.
func (f *FetchClock) Fetch(ctx context.Context, max int) ([]inbox.Delivery, error) {
	ds, err := f.Source.Fetch(ctx, max)
	if len(ds) > 0 {
		f.at.Store(time.Now().UnixNano())
	}
	return ds, err
}

// Applied records the spans of a committed inbox batch, from its
// fetch to now: one inbox store span linked to each traced message of the
// batch (a batch operation, as the relay's publish: Publisher), and a
// receipt span, child of the receipt's trace context, for each traced
// receipt (receipts are few: one per batch of the peer's inbox).
func Applied(t *telemetry.Tracer, clock *FetchClock, applied []inbox.Applied) {
	began := time.Unix(0, clock.at.Load())
	var links []trace.Link
	for _, a := range applied {
		sc := t.SpanContext(a.Delivery.Headers)
		if !sc.IsValid() {
			continue
		}
		v, ok := a.Value.(chat.Receipt)
		if !ok {
			links = append(links, trace.Link{SpanContext: sc})
			continue
		}
		attrs := []attribute.KeyValue{attribute.String(telemetry.AttrMessageID, a.Delivery.ID)}
		if len(v.Chats) > 0 {
			attrs = append(attrs, attribute.Int64(telemetry.AttrChatID, v.Chats[0].ChatID),
				attribute.Int64("chat.receipt.upto_seq", v.Chats[0].UptoSeq), attribute.Int("chat.receipt.chats", len(v.Chats)))
		}
		_, span := t.Start(trace.ContextWithRemoteSpanContext(context.Background(), sc), telemetry.SpanReceipt,
			trace.WithSpanKind(trace.SpanKindConsumer), trace.WithTimestamp(began), trace.WithAttributes(attrs...))
		span.End()
	}
	batchSpans(t, context.Background(), telemetry.SpanInboxStore, trace.SpanKindConsumer, began, links, nil,
		attribute.Int("messaging.batch.message_count", len(applied)))
}

// Push is the gateway's OnPush: a gateway push span, child of the
// message's trace context, from the push's start to its frame being
// queued. The gateway calls it only for a message that carries a trace
// context (gateway.Config.OnPush).
func Push(t *telemetry.Tracer) func(chat.Message, time.Time) {
	return func(m chat.Message, began time.Time) {
		ctx := t.ExtractTraceparent(context.Background(), m.TraceParent)
		// The message's chat and seq are on its send's span, the parent.
		_, span := t.Start(ctx, telemetry.SpanGatewayPush, trace.WithTimestamp(began), trace.WithAttributes(
			attribute.String(telemetry.AttrMessageID, m.ID)))
		span.End()
	}
}
