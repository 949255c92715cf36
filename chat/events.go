package chat

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/outbox"
	"github.com/outboxchat/outboxchat/redisq"
)

// Typed events in the log. The library reports typed events (outbox.RelayEvent,
// inbox.Event, redisq.Event); Serve turns them into Prometheus metrics and
// writes the ones worth a line as a JSON log line whose msg is EventLogMsg
// and whose EventKey attribute is the event's kind (the library's constant,
// or one of the app's below). The lab reads those lines, so renaming a log
// message never breaks it; renaming a kind breaks its build.
const (
	// EventLogMsg is the msg of an event line.
	EventLogMsg = "event"
	// EventKey is the attribute holding the event's kind.
	EventKey = "event"
)

// The app's own event kinds.
const (
	// EventRedriven: the Redriver published a stored message again because
	// no receipt came back in time (attributes message_id, chat_id, seq,
	// attempt).
	EventRedriven = "chat.redriven"
	// EventV1AddFailed: the v1 dual writer could not add a committed
	// message's job to Redis and keeps it in memory (message_id, err).
	EventV1AddFailed = "chat.v1_add_failed"
	// EventV1Lost: the v1 dual writer stops with count jobs still in memory:
	// they are lost.
	EventV1Lost = "chat.v1_lost"
)

// logEvent writes one event line: msg EventLogMsg, EventKey kind, then
// attrs.
func logEvent(log *slog.Logger, level slog.Level, kind string, attrs ...any) {
	log.Log(context.Background(), level, EventLogMsg, append([]any{EventKey, kind}, attrs...)...)
}

// relayEvents exports the relay's events as Prometheus metrics and logs its
// failed passes as events.
func relayEvents(reg prometheus.Registerer, log *slog.Logger) func(outbox.RelayEvent) {
	published := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "outboxchat_relay_published_total", Help: "Outbox rows published and marked sent.",
	})
	passes := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "outboxchat_relay_pass_seconds", Help: "Duration of relay passes that published rows, claim to commit.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
	})
	failed := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "outboxchat_relay_failures_total", Help: "Failed relay passes (rows stay unsent) and LISTEN failures, by stage.",
	}, []string{"stage"})
	listening := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "outboxchat_relay_listening", Help: "1 while the relay's LISTEN connection is up.",
	})
	for _, stage := range []string{"claim", "publish", "mark_sent", "listen"} {
		failed.WithLabelValues(stage) // export zeros: alerts and the dashboard use the series
	}
	reg.MustRegister(published, passes, failed, listening)
	return func(e outbox.RelayEvent) {
		switch e.Kind {
		case outbox.EventPublished:
			published.Add(float64(e.N))
			passes.Observe(e.Duration.Seconds())
		case outbox.EventPassFailed:
			failed.WithLabelValues(e.Stage).Inc()
			logEvent(log, slog.LevelInfo, string(e.Kind), "stage", e.Stage, "err", e.Err)
		case outbox.EventListenUp:
			listening.Set(1)
		case outbox.EventListenDown:
			listening.Set(0)
			if e.Err != nil {
				failed.WithLabelValues("listen").Inc()
			}
		}
	}
}

// inboxEvents exports the inbox consumer's events as Prometheus metrics and
// logs duplicates and dead letters as events.
func inboxEvents(reg prometheus.Registerer, log *slog.Logger) func(inbox.Event) {
	applied := prometheus.NewCounter(prometheus.CounterOpts{Name: "outboxchat_inbox_applied_total", Help: "Inbox deliveries by outcome."})
	dups := prometheus.NewCounter(prometheus.CounterOpts{Name: "outboxchat_inbox_duplicates_total", Help: "Inbox deliveries by outcome."})
	dead := prometheus.NewCounter(prometheus.CounterOpts{Name: "outboxchat_inbox_dead_lettered_total", Help: "Inbox deliveries by outcome."})
	reg.MustRegister(applied, dups, dead)
	return func(e inbox.Event) {
		switch e.Kind {
		case inbox.EventApplied:
			applied.Add(float64(e.N))
		case inbox.EventDuplicate:
			dups.Add(float64(e.N))
			logEvent(log, slog.LevelInfo, string(e.Kind), "message_id", e.MessageID, "ref", e.Ref)
		case inbox.EventDeadLettered:
			dead.Add(float64(e.N))
			logEvent(log, slog.LevelWarn, string(e.Kind), "message_id", e.MessageID, "ref", e.Ref, "reason", e.Reason)
		}
	}
}

// queueEvents exports the queue consumer's reclaims and trims as Prometheus
// counters (outboxchat_queue_reclaimed_total, outboxchat_queue_trimmed_total)
// and logs the reclaims, the pending entries found deleted from the stream
// (one line per entry) and a lost consumer group as events.
func queueEvents(reg prometheus.Registerer, log *slog.Logger, lock time.Duration) func(redisq.Event) {
	reclaimed := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "outboxchat_queue_reclaimed_total", Help: "Stalled jobs taken over from another consumer after the lock duration.",
	})
	trimmed := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "outboxchat_queue_trimmed_total", Help: "Acknowledged entries trimmed from the stream this service reads.",
	})
	reg.MustRegister(reclaimed, trimmed)
	return func(e redisq.Event) {
		switch e.Kind {
		case redisq.EventReclaimed:
			reclaimed.Add(float64(e.N))
			logEvent(log, slog.LevelInfo, string(e.Kind), "count", e.N, "lock_duration", lock)
		case redisq.EventTrimmed:
			trimmed.Add(float64(e.N))
		case redisq.EventDeletedPending:
			for _, id := range e.StreamIDs {
				logEvent(log, slog.LevelWarn, string(e.Kind), "stream_id", id)
			}
		case redisq.EventGroupLost:
			logEvent(log, slog.LevelWarn, string(e.Kind), "err", e.Err)
		}
	}
}
