package chat

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/outboxchat/outboxchat/internal/natsname"
)

// Service names. Each is also the name of the service's Postgres schema and
// role, and of its side in the chat ("from" in the event payload).
const (
	Consumers = "consumers"
	Workers   = "workers"
)

// Peer returns the other service's name, or "" for an unknown service.
func Peer(service string) string {
	switch service {
	case Consumers:
		return Workers
	case Workers:
		return Consumers
	}
	return ""
}

// ErrUnknownService is returned for a service name other than Consumers or Workers.
var ErrUnknownService = errors.New("chat: unknown service (want consumers or workers)")

// CheckService returns nil for Consumers or Workers and an error wrapping
// ErrUnknownService for any other name.
func CheckService(service string) error {
	if Peer(service) == "" {
		return fmt.Errorf("%w: %q", ErrUnknownService, service)
	}
	return nil
}

// QueueName is the Redis queue carrying messages from service from to its peer.
func QueueName(from string) string { return from + "-to-" + Peer(from) }

// InboxChannel is the NOTIFY channel of service's inbox commits (the
// gateway's wake-up for received messages).
func InboxChannel(service string) string { return service + "_inbox" }

// OutboxChannel is the NOTIFY channel of service's outbox (the relay's and
// the gateway's wake-up for sent messages).
func OutboxChannel(service string) string { return service + "_outbox" }

// DefaultRedisPrefix prefixes every Redis key of a deployment unless it is
// configured otherwise (several deployments on one Redis).
const DefaultRedisPrefix = "outboxchat:"

// Typed events in the log. The library reports typed events (outbox.RelayEvent,
// inbox.Event, redisq.Event); the server turns them into Prometheus metrics and
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

// LogEvent writes one event line: msg EventLogMsg, EventKey kind, then
// attrs.
func LogEvent(log *slog.Logger, level slog.Level, kind string, attrs ...any) {
	log.Log(context.Background(), level, EventLogMsg, append([]any{EventKey, kind}, attrs...)...)
}

// WebSocket subprotocols. A browser cannot set headers on a WebSocket, so a
// client offers two subprotocols, WSProtocol and WSBearerPrefix+<token>;
// the server selects WSProtocol (a browser fails a handshake whose answer
// selects none of those offered) and never echoes the token. A client may
// instead send {"token": "<jwt>"} as its first frame. The query string is
// never read for a token: access logs keep URLs.
const (
	WSProtocol     = "outboxchat.v1"
	WSBearerPrefix = "bearer."
)

// Close codes of an authenticated WebSocket (4000–4999: private use, RFC
// 6455 §7.4.2), after the HTTP statuses.
const (
	CloseUnauthorized = 4401 // no, bad or expired token
	CloseForbidden    = 4403 // the token does not cover the chat
	CloseTooMany      = 4429 // the user's socket cap
)

// NATSName is s with every character a JetStream stream or consumer name
// may not hold (anything but letters, digits, '-' and '_', e.g. the '.'
// of a partition's queue and the ':' of DefaultRedisPrefix) as '_'. The
// chat's stream of partition p's queue from service from is
// NATSName(prefix) + NATSName(PartitionQueue(from, p)).
func NATSName(s string) string { return natsname.Safe(s) }
