package chat

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/inbox"
)

// InboxHandler is the chat's inbox.Handler: it records a message.created
// event from the other service in <service>.inbox, keyed by message id, and
// in the same transaction NOTIFYs the gateway channel with the chat id
// (invariant 7). A duplicate inserts nothing and is logged in
// <service>.inbox_duplicates instead. It is safe for concurrent use.
type InboxHandler struct {
	service string
	insert  string
	dup     string
	channel string
}

// NewInboxHandler returns the handler for service's inbox; channel is the
// gateway's NOTIFY channel (InboxChannel(service)).
func NewInboxHandler(service string) (*InboxHandler, error) {
	if err := checkService(service); err != nil {
		return nil, err
	}
	s := pgx.Identifier{service}.Sanitize()
	return &InboxHandler{
		service: service,
		channel: InboxChannel(service),
		// One round trip: the insert, and the NOTIFY only when the row is
		// new (Postgres folds equal notifications of one transaction).
		insert: `WITH ins AS (
			INSERT INTO ` + s + `.inbox (message_id, chat_id, seq, body, sender, sent_at)
			VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (message_id) DO NOTHING RETURNING chat_id)
			SELECT pg_notify($7, chat_id::text) FROM ins`,
		dup: `INSERT INTO ` + s + `.inbox_duplicates (message_id) VALUES ($1)`,
	}, nil
}

// InboxChannel is the NOTIFY channel of service's new inbox rows.
func InboxChannel(service string) string { return service + "_inbox" }

// OutboxChannel is the NOTIFY channel of service's outbox (relay wake-up).
func OutboxChannel(service string) string { return service + "_outbox" }

// Apply implements inbox.Handler. A payload that is not a valid
// message.created event from the other service returns an error wrapping
// inbox.ErrMalformed without touching tx.
func (h *InboxHandler) Apply(ctx context.Context, tx pgx.Tx, d inbox.Delivery) (bool, error) {
	m, err := DecodeEvent(d.Payload)
	if err != nil {
		return false, fmt.Errorf("%w: %v", inbox.ErrMalformed, err)
	}
	if d.ID != "" && d.ID != m.ID {
		return false, fmt.Errorf("%w: job id %q differs from message id %q", inbox.ErrMalformed, d.ID, m.ID)
	}
	if m.From != Peer(h.service) {
		return false, fmt.Errorf("%w: message from %q, expected %q", inbox.ErrMalformed, m.From, Peer(h.service))
	}
	rows, err := tx.Query(ctx, h.insert, m.ID, m.ChatID, m.Seq, m.Body, m.From, m.SentAt, h.channel)
	if err != nil {
		return false, fmt.Errorf("insert inbox: %w", err)
	}
	n := 0
	for rows.Next() {
		n++
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return false, fmt.Errorf("insert inbox: %w", err)
	}
	if n == 1 {
		return true, nil
	}
	if _, err := tx.Exec(ctx, h.dup, m.ID); err != nil {
		return false, fmt.Errorf("record duplicate: %w", err)
	}
	return false, nil
}

var _ inbox.Handler = (*InboxHandler)(nil)
