package server

import (
	"context"
	"log/slog"
	"time"

	"github.com/outboxchat/outboxchat/chat/store/prune"
	"github.com/outboxchat/outboxchat/internal/service"
)

// retentionEvery is how often the retention service prunes, or every
// retention period when that is shorter (a history kept for seconds is
// pruned every few seconds). Each pass deletes in bounded batches
// (prune.DefaultBatch) until nothing older than the retention is
// left, so a pass after the first takes about one interval's worth of
// history.
const retentionEvery = time.Minute

// retention deletes the service's history older than its retention
// (prune.Run: messages, inbox rows, receipts, gap fills, duplicates, and
// never what a chat's seq, watermark and receipts need), every
// retentionEvery, the first pass right at start. A service (Start/Stop)
// with a runOnce a test can call. Several processes may run it on one
// database: their DELETEs only take turns.
type retention struct {
	db   prune.DB
	cfg  prune.Config // its Deleted counts the rows by table
	log  *slog.Logger
	life service.Lifecycle
}

// newRetention prunes service's history older than olderThan (> 0) on db;
// deleted, when set, counts the rows by table (the metric).
func newRetention(db prune.DB, svc string, olderThan time.Duration, deleted func(string, int64), log *slog.Logger) *retention {
	return &retention{db: db, log: log.With("component", "chat.retention"),
		cfg:  prune.Config{Service: svc, OlderThan: olderThan, Deleted: deleted},
		life: service.Lifecycle{Name: "chat: history retention"}}
}

// runOnce prunes once and returns what it deleted.
func (r *retention) runOnce(ctx context.Context) (prune.Counts, error) {
	n, err := prune.Run(ctx, r.db, r.cfg)
	if n.Total() > 0 {
		r.log.Info("history pruned", "older_than", r.cfg.OlderThan, "rows", n.Total(),
			"messages", n["messages"], "receipts", n["receipts"], "inbox", n["inbox"])
	}
	return n, err
}

// Start runs runOnce at once and then every min(retentionEvery, the
// retention), until Stop.
func (r *retention) Start(ctx context.Context) error {
	every := min(retentionEvery, r.cfg.OlderThan)
	return r.life.Start(ctx, func(run *service.Run) {
		run.Every(0, func(ctx context.Context) time.Duration {
			if _, err := r.runOnce(ctx); err != nil && ctx.Err() == nil {
				r.log.Warn("pruning history failed; retried at the next pass", "err", err, "every", every)
			}
			return every
		})
	})
}

// Stop stops the passes; a pass in flight is cancelled (its DELETEs are
// each a transaction: what committed stays).
func (r *retention) Stop(ctx context.Context) error { return r.life.Stop(ctx) }
