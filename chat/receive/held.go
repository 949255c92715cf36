package receive

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/internal/service"
)

// DefaultHeldInterval is how often HeldChanges looks for held changes whose
// message has arrived.
const DefaultHeldInterval = 500 * time.Millisecond

// HeldChanges applies the edits and deletes that arrived before their
// message (held in <service>.inbox_held_changes by the inbox handler) once
// the message is in the inbox: per message the highest held version, when
// it is above the row's, with the same NOTIFY as a change applied at once.
// Applied or outdated, the held rows go; so do those of a message at or
// below its chat's floor that is not in the inbox (received once, deleted
// since by retention or by hand: it will not come again). A pass costs one scan of the held
// table, which is empty in steady state. Safe for concurrent use; several
// processes may run one (a row is taken by one pass: DELETE … RETURNING).
type HeldChanges struct {
	pool     *pgxpool.Pool
	interval time.Duration
	log      *slog.Logger
	sql      string
	channel  string
	life     service.Lifecycle
}

// NewHeldChanges returns the held-changes service of service's inbox on
// pool; interval 0 means DefaultHeldInterval; log nil means slog.Default().
// Error: an unknown service.
func NewHeldChanges(pool *pgxpool.Pool, service string, interval time.Duration, log *slog.Logger) (*HeldChanges, error) {
	if err := chat.CheckService(service); err != nil {
		return nil, err
	}
	if interval <= 0 {
		interval = DefaultHeldInterval
	}
	if log == nil {
		log = slog.Default()
	}
	s := pgx.Identifier{service}.Sanitize()
	h := &HeldChanges{pool: pool, interval: interval, log: log.With("component", "chat.held_changes"),
		channel: chat.ChangeChannel(service),
		sql: `WITH h AS (DELETE FROM ` + s + `.inbox_held_changes hc USING ` + s + `.inbox i
				WHERE hc.message_id = i.message_id RETURNING hc.*),
			b AS (SELECT DISTINCT ON (message_id) * FROM h ORDER BY message_id, version DESC),
			upd AS (UPDATE ` + s + `.inbox i SET body = b.body, version = b.version, edited_at = b.edited_at, deleted = b.deleted
				FROM b WHERE i.message_id = b.message_id AND i.version < b.version
				RETURNING i.message_id, i.chat_id, i.sender),
			gone AS (DELETE FROM ` + s + `.inbox_held_changes hc
				WHERE hc.seq <= coalesce((SELECT g.upto FROM ` + s + `.inbox_gap_fills g
					WHERE g.chat_id = hc.chat_id ORDER BY g.upto DESC LIMIT 1), 0)
				AND NOT EXISTS (SELECT 1 FROM ` + s + `.inbox i WHERE i.message_id = hc.message_id))
			SELECT count(pg_notify($1, u.chat_id || ':' || u.sender || ':' || u.message_id)) FROM upd u`}
	h.life.Name = "chat: held changes"
	return h, nil
}

// Start runs passes every interval until Stop or until ctx ends; it does
// not block. Errors: service.ErrAlreadyStarted (wrapped) while running.
func (h *HeldChanges) Start(ctx context.Context) error {
	return h.life.Start(ctx, func(run *service.Run) {
		run.Every(h.interval, func(ctx context.Context) time.Duration {
			if _, err := h.RunOnce(ctx); err != nil && ctx.Err() == nil {
				h.log.Warn("held changes pass failed; retried at the next one", "err", err)
			}
			return h.interval
		})
	})
}

// Stop ends the loop and waits for the pass in flight. Idempotent.
func (h *HeldChanges) Stop(ctx context.Context) error { return h.life.Stop(ctx) }

// RunOnce applies the held changes whose message is in the inbox and
// returns how many messages it changed.
func (h *HeldChanges) RunOnce(ctx context.Context) (int, error) {
	var n int
	if err := h.pool.QueryRow(ctx, h.sql, h.channel).Scan(&n); err != nil {
		return 0, fmt.Errorf("apply held changes: %w", err)
	}
	return n, nil
}
