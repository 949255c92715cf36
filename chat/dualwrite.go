package chat

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/internal/service"
	"github.com/outboxchat/outboxchat/redisq"
)

// dualWriter is the write-up's v1, kept for the lab to show what the outbox
// fixes: commit the message, then add the job to Redis from the API process.
// An add that fails is kept in this process's memory and retried, as
// ioredis's offline queue did; a redeploy loses whatever is waiting. Never
// use this outside the lab.
type dualWriter struct {
	store   *Store
	pub     *redisq.Publisher
	log     *slog.Logger
	mu      sync.Mutex
	pending []redisq.Job
	life    service.Lifecycle
}

func newDualWriter(store *Store, pub *redisq.Publisher, log *slog.Logger) *dualWriter {
	return &dualWriter{store: store, pub: pub, log: log.With("component", "chat.v1")}
}

func (d *dualWriter) send(ctx context.Context, chatID int64, body string) (Message, error) {
	m := Message{ChatID: chatID, Body: body, From: d.store.service, Author: authorOf(ctx)}
	err := pgx.BeginFunc(ctx, d.store.pool, func(tx pgx.Tx) error {
		// The chat's lock, then (a statement of its own, so a snapshot
		// that sees the previous holder's commit) the next seq.
		if _, err := tx.Exec(ctx, d.store.q.lockChat, chatID); err != nil {
			return fmt.Errorf("lock chat: %w", err)
		}
		return tx.QueryRow(ctx, d.store.q.insertOne, chatID, body, m.Author).Scan(&m.ID, &m.Seq, &m.SentAt)
	})
	if err != nil {
		return Message{}, fmt.Errorf("send: %w", err)
	}
	if d.store.afterCommit != nil {
		d.store.afterCommit([]Message{m})
	}
	payload, _ := json.Marshal(m)
	job := redisq.Job{ID: m.ID, Name: EventMessageCreated, Payload: payload}
	if _, err := d.pub.Add(ctx, job); err != nil {
		logEvent(d.log, slog.LevelWarn, EventV1AddFailed, "message_id", m.ID, "err", err)
		d.mu.Lock()
		d.pending = append(d.pending, job)
		d.mu.Unlock()
	}
	return m, nil
}

// Start runs the retry loop (internal/service contract; the loop's Redis
// adds run under the run's context, so a graceful stop just ends the loop).
func (d *dualWriter) Start(ctx context.Context) error {
	return d.life.Start(ctx, func(r *service.Run) { r.Go(func() { d.retryLoop(r.DrainContext()) }) })
}

func (d *dualWriter) retryLoop(ctx context.Context) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		d.mu.Lock()
		jobs := d.pending
		d.pending = nil
		d.mu.Unlock()
		if len(jobs) == 0 {
			continue
		}
		if _, err := d.pub.Add(ctx, jobs...); err != nil {
			d.mu.Lock()
			d.pending = append(jobs, d.pending...)
			d.mu.Unlock()
		}
	}
}

// Stop drops whatever is still pending: exactly the loss the write-up shows.
func (d *dualWriter) Stop(ctx context.Context) error {
	err := d.life.Stop(ctx)
	d.mu.Lock()
	if n := len(d.pending); n > 0 {
		logEvent(d.log, slog.LevelWarn, EventV1Lost, "count", n)
	}
	d.mu.Unlock()
	return err
}
