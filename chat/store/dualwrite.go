package store

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/outboxchat/outboxchat/chat"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/internal/service"
	"github.com/outboxchat/outboxchat/redisq"
)

// DualWriter is the write-up's v1, kept for the lab to show what the outbox
// fixes: commit the message, then add the job to the queue (Redis, or NATS)
// from the API process.
// An add that fails is kept in this process's memory and retried, as
// ioredis's offline queue did; a redeploy loses whatever is waiting. Never
// use this outside the lab.
type DualWriter struct {
	store   *Store
	pub     Adder
	log     *slog.Logger
	mu      sync.Mutex
	pending []redisq.Job
	life    service.Lifecycle
}

// Adder adds jobs to the queue: redisq.Publisher.Add, or the chat
// server's adapter of a NATS JetStream queue. It returns how many were
// added; on an error the caller retries all of them.
type Adder interface {
	Add(ctx context.Context, jobs ...redisq.Job) (int, error)
}

var _ Adder = (*redisq.Publisher)(nil)

// NewDualWriter returns a DualWriter that stores through store and adds
// the jobs through pub, logging to log (not nil). Start runs its retry loop.
func NewDualWriter(store *Store, pub Adder, log *slog.Logger) *DualWriter {
	return &DualWriter{store: store, pub: pub, log: log.With("component", "chat.v1")}
}

// Send stores the message (author "" for none), then adds its job to
// Redis; a failed add is kept in memory for the retry loop. Safe for
// concurrent use.
func (d *DualWriter) Send(ctx context.Context, chatID int64, body, author string) (chat.Message, error) {
	m := chat.Message{ChatID: chatID, Body: body, From: d.store.service, Author: author}
	err := pgx.BeginFunc(ctx, d.store.pool, func(tx pgx.Tx) error {
		// The chat's lock, then (a statement of its own, so a snapshot
		// that sees the previous holder's commit) the next seq.
		if _, err := tx.Exec(ctx, d.store.q.lockChat, chatID); err != nil {
			return fmt.Errorf("lock chat: %w", err)
		}
		return tx.QueryRow(ctx, d.store.q.insertOne, chatID, body, m.Author, sendClock()).Scan(&m.ID, &m.Seq, &m.SentAt)
	})
	if err != nil {
		return chat.Message{}, fmt.Errorf("send: %w", err)
	}
	if d.store.afterCommit != nil {
		d.store.afterCommit([]chat.Message{m})
	}
	payload, _ := json.Marshal(m)
	job := redisq.Job{ID: m.ID, Name: chat.EventMessageCreated, Payload: payload}
	if _, err := d.pub.Add(ctx, job); err != nil {
		chat.LogEvent(d.log, slog.LevelWarn, chat.EventV1AddFailed, "message_id", m.ID, "err", err)
		d.mu.Lock()
		d.pending = append(d.pending, job)
		d.mu.Unlock()
	}
	return m, nil
}

// Start runs the retry loop (internal/service contract): every 250 ms it
// adds the pending jobs under the run's drain context, so a graceful stop
// cancels an add in flight and its jobs stay pending (and are lost).
func (d *DualWriter) Start(ctx context.Context) error {
	return d.life.Start(ctx, func(r *service.Run) {
		r.Every(retryEvery, func(context.Context) time.Duration {
			d.retry(r.DrainContext())
			return retryEvery
		})
	})
}

// retryEvery is the pause between two retries of the pending adds.
const retryEvery = 250 * time.Millisecond

// retry adds the pending jobs once; those it could not add stay pending.
func (d *DualWriter) retry(ctx context.Context) {
	d.mu.Lock()
	jobs := d.pending
	d.pending = nil
	d.mu.Unlock()
	if len(jobs) == 0 {
		return
	}
	if _, err := d.pub.Add(ctx, jobs...); err != nil {
		d.mu.Lock()
		d.pending = append(jobs, d.pending...)
		d.mu.Unlock()
	}
}

// Stop drops whatever is still pending: exactly the loss the write-up shows.
func (d *DualWriter) Stop(ctx context.Context) error {
	err := d.life.Stop(ctx)
	d.mu.Lock()
	if n := len(d.pending); n > 0 {
		chat.LogEvent(d.log, slog.LevelWarn, chat.EventV1Lost, "count", n)
	}
	d.mu.Unlock()
	return err
}
