package receive

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/outboxchat/outboxchat/chat"

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
// again by the Redriver, past its dedupe mark (redisq.Publisher.Readd: the
// key may outlive the entry), and the receiver's inbox drops it if it had it
// after all — its receipt then marks it delivered.
//
// Who re-drives: a loop of its own (this file), run next to the relay (the
// relay role: it needs the database and Redis), not a branch inside the
// relay. It works from the messages table (above the chat's newest receipt
// and old enough), not from outbox rows, which the relay may delete or mark
// when published. Several instances share the work: each pass locks its rows
// with FOR UPDATE SKIP LOCKED and stamps redriven_at before it commits.
//
// Cost: in steady state, per Interval, three index descents for each of
// up to ChatsPerPass chats (the passes go round the chats, in chat_id
// order), and nothing published; no index grows with the delivered
// messages, so a session holding back the xmin horizon does not slow it
// (the partial index of undelivered messages it used to scan kept every
// delivered row's dead entry then: 229 ms a pass). When the
// receiver is down or behind for longer than After, its undelivered
// messages are published again at most MaxPerPass per Interval, each with a
// backoff doubling from After up to MaxBackoff: the stream gets copies that
// the inbox skips as duplicates (counted in
// outboxchat_inbox_duplicates_total), and each copy costs one
// UPDATE of its message row here.

// Re-drive defaults.
const (
	// DefaultRedriveMaxPerPass is RedriveConfig.MaxPerPass's default.
	DefaultRedriveMaxPerPass = 100
	// DefaultRedriveChatsPerPass is RedriveConfig.ChatsPerPass's default:
	// about 30,000 index descents, some 30–60 ms of one core, per pass.
	DefaultRedriveChatsPerPass = 10000
	// DefaultRedriveInterval is RedriveConfig.Interval's default ceiling.
	DefaultRedriveInterval = 5 * time.Second
	// redriveTimeout bounds one pass: claim, publish, commit.
	redriveTimeout = 10 * time.Second
)

// Republisher adds jobs again past their dedupe marks
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
	// ChatsPerPass bounds the chats one pass looks at: a pass costs about
	// three index descents per chat, and the passes go round the chats
	// (in chat_id order) ChatsPerPass at a time, so a message is re-driven
	// at most ceil(chats / ChatsPerPass) × Interval after it is due.
	// Default DefaultRedriveChatsPerPass (10,000).
	ChatsPerPass int
	// MaxBackoff caps the per-message backoff: after its k-th re-drive a
	// message waits After × 2^k (at most MaxBackoff) before the next.
	// Default 16 × After.
	MaxBackoff time.Duration
	// Redriven, when set, is called with the number of messages each pass
	// published (> 0), after its commit (the app's
	// outboxchat_redriven_total). It must not block.
	Redriven func(n int)
	// Partitions, when it has more than one element, are the publishers of
	// the partitions' streams (Partitions[p] to chat.PartitionQueue(service,
	// p)): a message is published again to its chat's partition, and a
	// message whose event still waits in its partition's outbox
	// (chat.OutboxTable) is left to the relay. NewRedriver's pub is then
	// not used (it may be nil). Default nil: one partition, through pub.
	Partitions []Republisher
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
	// pubs are the publishers by partition (len 1: pub).
	pubs  []Republisher
	cfg   RedriveConfig
	log   *slog.Logger
	chats string
	claim string
	life  service.Lifecycle
	// pos is where the next pass starts in the cycle over the chats. Only
	// a place in the cycle: lost on a restart, which starts it again.
	mu  sync.Mutex
	pos redrivePos
}

// redrivePos is a Redriver's place in its cycle over the chats.
type redrivePos struct {
	// after is the chat_id after which the pass starts (0: from the
	// first chat).
	after int64
	// resumed: the pass starts in the chat a full pass stopped in. If it
	// is full again and stops in that same chat, the next pass goes on
	// past it: a chat that always has MaxPerPass messages due (one whose
	// receipt never comes) must not hold back the re-drive of the chats
	// after it.
	resumed bool
}

// NewRedriver returns a Redriver of service's messages on pool, publishing
// through pub to QueueName(service). Errors: unknown service, nil pool or
// pub, After <= 0, negative fields.
func NewRedriver(pool *pgxpool.Pool, service string, pub Republisher, cfg *RedriveConfig) (*Redriver, error) {
	if err := chat.CheckService(service); err != nil {
		return nil, err
	}
	if pool == nil || cfg == nil {
		return nil, errors.New("chat: NewRedriver needs a pool, a publisher and a config")
	}
	c := *cfg
	pubs := c.Partitions
	if len(pubs) <= 1 {
		pubs = []Republisher{pub}
	}
	if slices.Contains(pubs, nil) {
		return nil, errors.New("chat: NewRedriver needs a pool, a publisher and a config")
	}
	switch {
	case c.After <= 0:
		return nil, fmt.Errorf("chat: redrive: After %v must be positive", c.After)
	case c.Interval < 0 || c.MaxPerPass < 0 || c.MaxBackoff < 0 || c.ChatsPerPass < 0:
		return nil, errors.New("chat: redrive: negative Interval, MaxPerPass, ChatsPerPass or MaxBackoff")
	}
	if c.Interval == 0 {
		c.Interval = RedriveInterval(c.After)
	}
	if c.MaxPerPass == 0 {
		c.MaxPerPass = DefaultRedriveMaxPerPass
	}
	if c.ChatsPerPass == 0 {
		c.ChatsPerPass = DefaultRedriveChatsPerPass
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = 16 * c.After
	}
	log := c.Logger
	if log == nil {
		log = slog.Default()
	}
	s := pgx.Identifier{service}.Sanitize()
	// The event may wait in any partition's outbox (its chat's): with one
	// partition the one table, else each (an index probe of the unsent
	// rows per table).
	var unsent strings.Builder
	for p := range pubs {
		ob := pgx.Identifier(strings.Split(chat.OutboxTable(service, p), ".")).Sanitize()
		unsent.WriteString(`
					  AND NOT EXISTS (SELECT 1 FROM ` + ob + ` o WHERE o.sent_at IS NULL AND o.idempotency_key = m.id::text)`)
	}
	return &Redriver{
		pool: pool, service: service, pub: pubs[0], pubs: pubs, cfg: c,
		log: log.With("component", "chat.redrive"),
		// One pass looks at up to ChatsPerPass chats, from the chat after
		// pos.after on: a skip scan of the (chat_id, seq) index, one
		// descent per chat (a recursive CTE; the outer LIMIT stops it).
		chats: `WITH RECURSIVE c AS (
				(SELECT chat_id FROM ` + s + `.messages WHERE chat_id > $1 ORDER BY chat_id LIMIT 1)
				UNION ALL
				SELECT (SELECT m.chat_id FROM ` + s + `.messages m WHERE m.chat_id > c.chat_id ORDER BY m.chat_id LIMIT 1)
				FROM c WHERE c.chat_id IS NOT NULL)
			SELECT chat_id FROM c WHERE chat_id IS NOT NULL LIMIT $2`,
		// Of those chats ($4, ascending), the messages above the chat's
		// newest receipt (none covers them), older than After, past their
		// own backoff (After × 2^redrives, capped), whose outbox event is
		// not still waiting for the relay (the relay publishes those; with
		// rows deleted when published, no row means published). In chat
		// and seq order, so the receiver gets each chat's in order. SKIP
		// LOCKED: another re-drive pass has them. The UPDATE stamps them
		// in the same transaction, committed after the publish. Each chat
		// costs two index descents when nothing of it is in flight.
		// created_at and redriven_at are the database's clock; if it was
		// stepped back, rows written before the step lie in its future and
		// would wait out the step: a time more than After ahead of now()
		// counts as due, so a step back delays a re-drive by at most After,
		// whatever its size (an early copy is harmless: the inbox drops
		// duplicates).
		claim: `WITH due AS (
				SELECT m.id, c.ord, m.seq FROM unnest($4::bigint[]) WITH ORDINALITY AS c(chat_id, ord)
				CROSS JOIN LATERAL (SELECT coalesce((SELECT upto_seq FROM ` + s + `.receipts
					WHERE chat_id = c.chat_id ORDER BY upto_seq DESC LIMIT 1), 0) AS upto) w
				CROSS JOIN LATERAL (SELECT m.id, m.seq FROM ` + s + `.messages m
					WHERE m.chat_id = c.chat_id AND m.seq > w.upto
					  AND (m.created_at < now() - $1::interval OR m.created_at > now() + $1::interval)
					  AND (m.redriven_at IS NULL OR m.redriven_at < now() - least($1::interval * power(2, m.redrives), $2::interval)
					       OR m.redriven_at > now() + $1::interval)` + unsent.String() + `
					ORDER BY m.seq LIMIT $3
					FOR UPDATE OF m SKIP LOCKED) m
				ORDER BY c.ord, m.seq LIMIT $3)
			UPDATE ` + s + `.messages m SET redrives = m.redrives + 1, redriven_at = now()
			FROM due WHERE m.id = due.id
			RETURNING m.id::text, m.chat_id, m.seq, m.body, m.created_at, m.redrives, m.deleted`,
	}, nil
}

// RedriveInterval is RedriveConfig.Interval's default for after: After/4,
// at least 100 ms and at most DefaultRedriveInterval.
func RedriveInterval(after time.Duration) time.Duration {
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
	r.mu.Lock()
	from := r.pos
	r.mu.Unlock()
	next := from
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, r.chats, from.after, r.cfg.ChatsPerPass)
		if err != nil {
			return fmt.Errorf("list chats: %w", err)
		}
		chats, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return fmt.Errorf("list chats: %w", err)
		}
		if len(chats) < r.cfg.ChatsPerPass {
			next = redrivePos{} // the cycle is done: the next pass starts again
		} else {
			next = redrivePos{after: chats[len(chats)-1]}
		}
		if len(chats) == 0 {
			return nil
		}
		rows, err = tx.Query(ctx, r.claim, r.cfg.After, r.cfg.MaxBackoff, r.cfg.MaxPerPass, chats)
		if err != nil {
			return fmt.Errorf("claim undelivered messages: %w", err)
		}
		var jobs []redisq.Job
		var attempts []int
		var ms []chat.Message
		for rows.Next() {
			m := chat.Message{From: r.service}
			var attempt int
			if err := rows.Scan(&m.ID, &m.ChatID, &m.Seq, &m.Body, &m.SentAt, &attempt, &m.Deleted); err != nil {
				rows.Close()
				return fmt.Errorf("claim undelivered messages: %w", err)
			}
			p, err := json.Marshal(m)
			if err != nil {
				rows.Close()
				return fmt.Errorf("encode event: %w", err)
			}
			jobs = append(jobs, redisq.Job{ID: m.ID, Name: chat.EventMessageCreated, Payload: p})
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
		if len(jobs) == r.cfg.MaxPerPass {
			// The pass was full: the last chat may have more that are
			// due; the next pass starts with it, unless this pass already
			// resumed in that chat and never got past it: then the next
			// goes on past it (its due messages come at the next round),
			// so each pass after two moves the cycle on.
			last := ms[order[len(order)-1]].ChatID
			if from.resumed && last == chats[0] {
				next = redrivePos{after: last}
			} else {
				next = redrivePos{after: last - 1, resumed: true}
			}
		}
		if err := r.readd(ctx, sorted, ms, order); err != nil {
			return fmt.Errorf("publish again: %w", err)
		}
		for _, k := range order {
			chat.LogEvent(r.log, slog.LevelWarn, chat.EventRedriven,
				"message_id", ms[k].ID, "chat_id", ms[k].ChatID, "seq", ms[k].Seq, "attempt", attempts[k])
		}
		n = len(jobs)
		return nil
	})
	if err != nil {
		return 0, err
	}
	r.mu.Lock()
	if r.pos == from { // unless a concurrent pass moved it
		r.pos = next
	}
	r.mu.Unlock()
	if n > 0 && r.cfg.Redriven != nil {
		r.cfg.Redriven(n)
	}
	return n, nil
}

// readd publishes jobs (sorted: jobs[i] is the message ms[order[i]]) again,
// each to its chat's partition, in their order.
func (r *Redriver) readd(ctx context.Context, jobs []redisq.Job, ms []chat.Message, order []int) error {
	if len(r.pubs) == 1 {
		_, err := r.pub.Readd(ctx, jobs...)
		return err
	}
	parts := chat.SplitByPartition(len(r.pubs), jobs, func(i int) int64 { return ms[order[i]].ChatID })
	for p, js := range parts {
		if len(js) == 0 {
			continue
		}
		if _, err := r.pubs[p].Readd(ctx, js...); err != nil {
			return fmt.Errorf("partition %d: %w", p, err)
		}
	}
	return nil
}
