package chat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/internal/service"
	"github.com/outboxchat/outboxchat/redisq"
)

// Re-drive: the end-to-end half of "never lost".
//
// The relay's job ends when Redis has the entry; Redis can still lose it (a
// failover to a replica that had not received it yet, a restart without the
// AOF, FLUSHALL, XDEL or a trim during an incident, eviction). The sender
// knows what arrived from the other side's receipts (receipt.go): a message
// stored but without delivered_at after RedriveConfig.After is published
// again by the Redriver, past its dedupe key (redisq.Publisher.Readd: the
// key may outlive the entry), and the receiver's inbox drops it if it had it
// after all — its receipt then marks it delivered.
//
// Who re-drives: a loop of its own (this file), run next to the relay (the
// relay role: it needs the database and Redis), not a branch inside the
// relay. It works from the messages table (delivered_at IS NULL and old
// enough), not from outbox rows, which the relay may delete or mark when
// published. Several instances share the work: each pass locks its rows
// with FOR UPDATE SKIP LOCKED and stamps redriven_at before it commits.
//
// Cost: in steady state one index scan per Interval of the partial index
// messages_undelivered (only messages in flight: the last few milliseconds'
// worth), and nothing published. When the receiver is down or behind for
// longer than After, its undelivered messages are published again at most
// MaxPerPass per Interval, each with a backoff doubling from After up to
// MaxBackoff: the stream gets copies that the inbox skips as duplicates
// (counted in outboxchat_inbox_duplicates_total), and each copy costs one
// UPDATE of its message row here.

// Re-drive defaults.
const (
	// DefaultRedriveMaxPerPass is RedriveConfig.MaxPerPass's default.
	DefaultRedriveMaxPerPass = 100
	// DefaultRedriveInterval is RedriveConfig.Interval's default ceiling.
	DefaultRedriveInterval = 5 * time.Second
	// redriveTimeout bounds one pass: claim, publish, commit.
	redriveTimeout = 10 * time.Second
)

// Republisher adds jobs again past their dedupe keys
// (redisq.Publisher.Readd).
type Republisher interface {
	Readd(ctx context.Context, jobs ...redisq.Job) (int, error)
}

var _ Republisher = (*redisq.Publisher)(nil)

// RedriveConfig configures a Redriver. A zero field means its default.
type RedriveConfig struct {
	// After is how long a message may stay stored and undelivered (no
	// receipt) before it is published again. Required, > 0. Serve uses
	// twice the lock duration, so a job that is only stalled (reclaimed
	// after the lock duration) is not re-driven.
	After time.Duration
	// Interval is the time between passes. Default After/4, at most
	// DefaultRedriveInterval (5 s), at least 100 ms.
	Interval time.Duration
	// MaxPerPass bounds the messages one pass publishes: the re-drive's
	// rate is at most MaxPerPass per Interval. Default
	// DefaultRedriveMaxPerPass (100).
	MaxPerPass int
	// MaxBackoff caps the per-message backoff: after its k-th re-drive a
	// message waits After × 2^k (at most MaxBackoff) before the next.
	// Default 16 × After.
	MaxBackoff time.Duration
	// Redriven, when set, is called with the number of messages each pass
	// published (> 0), after its commit (the app's
	// outboxchat_redriven_total). It must not block.
	Redriven func(n int)
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// Redriver publishes again the service's messages that were not delivered
// in time (see the comment at the top of this file). It is a
// service.Service: Start runs its loop, Stop ends it; RunOnce runs one
// pass. Safe for concurrent use.
type Redriver struct {
	pool    *pgxpool.Pool
	service string
	pub     Republisher
	cfg     RedriveConfig
	log     *slog.Logger
	claim   string
	life    service.Lifecycle
}

// NewRedriver returns a Redriver of service's messages on pool, publishing
// through pub to QueueName(service). Errors: unknown service, nil pool or
// pub, After <= 0, negative fields.
func NewRedriver(pool *pgxpool.Pool, service string, pub Republisher, cfg *RedriveConfig) (*Redriver, error) {
	if err := checkService(service); err != nil {
		return nil, err
	}
	if pool == nil || pub == nil || cfg == nil {
		return nil, errors.New("chat: NewRedriver needs a pool, a publisher and a config")
	}
	c := *cfg
	switch {
	case c.After <= 0:
		return nil, fmt.Errorf("chat: redrive: After %v must be positive", c.After)
	case c.Interval < 0 || c.MaxPerPass < 0 || c.MaxBackoff < 0:
		return nil, errors.New("chat: redrive: negative Interval, MaxPerPass or MaxBackoff")
	}
	if c.Interval == 0 {
		c.Interval = redriveInterval(c.After)
	}
	if c.MaxPerPass == 0 {
		c.MaxPerPass = DefaultRedriveMaxPerPass
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = 16 * c.After
	}
	log := c.Logger
	if log == nil {
		log = slog.Default()
	}
	s := pgx.Identifier{service}.Sanitize()
	return &Redriver{
		pool: pool, service: service, pub: pub, cfg: c,
		log: log.With("component", "chat.redrive"),
		// Messages without a receipt, older than After, past their own
		// backoff (After × 2^redrives, capped), whose outbox event is not
		// still waiting for the relay (the relay publishes those; with
		// rows deleted when published, no row means published). In chat
		// and seq order, so the receiver gets each chat's in order. SKIP
		// LOCKED: another re-drive pass has them. The UPDATE stamps them
		// in the same transaction, committed after the publish.
		claim: `WITH due AS (
				SELECT m.id FROM ` + s + `.messages m
				WHERE m.delivered_at IS NULL AND m.created_at < now() - $1::interval
				  AND (m.redriven_at IS NULL OR m.redriven_at < now() - least($1::interval * power(2, m.redrives), $2::interval))
				  AND NOT EXISTS (SELECT 1 FROM ` + s + `.outbox o WHERE o.sent_at IS NULL AND o.idempotency_key = m.id::text)
				ORDER BY m.chat_id, m.seq LIMIT $3
				FOR UPDATE OF m SKIP LOCKED)
			UPDATE ` + s + `.messages m SET redrives = m.redrives + 1, redriven_at = now()
			FROM due WHERE m.id = due.id
			RETURNING m.id::text, m.chat_id, m.seq, m.body, m.created_at, m.redrives`,
	}, nil
}

// redriveInterval is RedriveConfig.Interval's default for after.
func redriveInterval(after time.Duration) time.Duration {
	return min(max(after/4, 100*time.Millisecond), DefaultRedriveInterval)
}

// Start runs the loop in a goroutine until Stop, or until ctx is done (a
// hard stop: the pass in flight is abandoned and rolls back). It does not
// block. It returns an error wrapping service.ErrAlreadyStarted while a run
// is in progress, or ctx.Err() if ctx is already done.
func (r *Redriver) Start(ctx context.Context) error {
	err := r.life.Start(ctx, func(run *service.Run) {
		run.Every(r.cfg.Interval, func(ctx context.Context) time.Duration {
			if _, err := r.RunOnce(ctx); err != nil && ctx.Err() == nil {
				r.log.Warn("re-drive pass failed; retried at the next one", "err", err)
			}
			return r.cfg.Interval
		})
	})
	if err != nil {
		return fmt.Errorf("chat: start redrive: %w", err)
	}
	return nil
}

// Stop ends the loop after the pass in flight (abandoned, and rolled back,
// if ctx ends first) and waits for it. Idempotent; nil if not running.
func (r *Redriver) Stop(ctx context.Context) error {
	if err := r.life.Stop(ctx); err != nil {
		return fmt.Errorf("chat: stop redrive: %w", err)
	}
	return nil
}

// RunOnce runs one pass: in one transaction it claims up to MaxPerPass due
// messages, publishes them again (Republisher.Readd) and stamps them. It
// returns how many it published. On error the transaction rolls back:
// nothing is stamped, the next pass tries again. Each message published is
// logged with its id.
func (r *Redriver) RunOnce(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, redriveTimeout)
	defer cancel()
	var n int
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, r.claim, r.cfg.After, r.cfg.MaxBackoff, r.cfg.MaxPerPass)
		if err != nil {
			return fmt.Errorf("claim undelivered messages: %w", err)
		}
		var jobs []redisq.Job
		var attempts []int
		var ms []Message
		for rows.Next() {
			m := Message{From: r.service}
			var attempt int
			if err := rows.Scan(&m.ID, &m.ChatID, &m.Seq, &m.Body, &m.SentAt, &attempt); err != nil {
				rows.Close()
				return fmt.Errorf("claim undelivered messages: %w", err)
			}
			p, err := json.Marshal(m)
			if err != nil {
				rows.Close()
				return fmt.Errorf("encode event: %w", err)
			}
			jobs = append(jobs, redisq.Job{ID: m.ID, Name: EventMessageCreated, Payload: p})
			attempts = append(attempts, attempt)
			ms = append(ms, m)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("claim undelivered messages: %w", err)
		}
		if len(jobs) == 0 {
			return nil
		}
		// RETURNING has no order: publish each chat's in seq order.
		order := make([]int, len(jobs))
		for i := range order {
			order[i] = i
		}
		sort.Slice(order, func(i, j int) bool {
			a, b := order[i], order[j]
			if ms[a].ChatID != ms[b].ChatID {
				return ms[a].ChatID < ms[b].ChatID
			}
			return ms[a].Seq < ms[b].Seq
		})
		sorted := make([]redisq.Job, len(jobs))
		for i, k := range order {
			sorted[i] = jobs[k]
		}
		if _, err := r.pub.Readd(ctx, sorted...); err != nil {
			return fmt.Errorf("publish again: %w", err)
		}
		for _, k := range order {
			logEvent(r.log, slog.LevelWarn, EventRedriven,
				"message_id", ms[k].ID, "chat_id", ms[k].ChatID, "seq", ms[k].Seq, "attempt", attempts[k])
		}
		n = len(jobs)
		return nil
	})
	if err != nil {
		return 0, err
	}
	if n > 0 && r.cfg.Redriven != nil {
		r.cfg.Redriven(n)
	}
	return n, nil
}
