// Package retention deletes a service's history older than its retention
// period (--history-retention), in the relay role.
package retention

import (
	"context"
	"log/slog"
	"time"

	"github.com/outboxchat/outboxchat/chat/store/prune"
	"github.com/outboxchat/outboxchat/internal/service"
)

// period is how often the retention service prunes, or every
// retention period when that is shorter (a history kept for seconds is
// pruned every few seconds). Each pass deletes in bounded batches
// (prune.DefaultBatch) until nothing older than the retention is
// left, so a pass after the first takes about one interval's worth of
// history.
const period = time.Minute

// Pruner deletes the service's history older than its retention
// (prune.Run: messages, inbox rows, receipts, gap fills, duplicates, and
// never what a chat's seq, watermark and receipts need), every minute (or
// every retention period when that is shorter), the first pass right at
// start. A service (Start/Stop, internal/service) with a RunOnce a test can
// call. Several processes may run it on one database: their DELETEs only
// take turns.
type Pruner struct {
	db   prune.DB
	cfg  prune.Config // its Deleted counts the rows by table
	log  *slog.Logger
	life service.Lifecycle
}

// New returns the Pruner of service svc's history older than olderThan
// (> 0) on db; deleted, when set, counts the rows by table (the metric).
func New(db prune.DB, svc string, olderThan time.Duration, deleted func(string, int64), log *slog.Logger) *Pruner {
	return &Pruner{db: db, log: log.With("component", "chat.retention"),
		cfg:  prune.Config{Service: svc, OlderThan: olderThan, Deleted: deleted},
		life: service.Lifecycle{Name: "chat: history retention"}}
}

// RunOnce prunes once and returns what it deleted, by table, with
// prune.Run's error (what committed before it stays deleted).
func (r *Pruner) RunOnce(ctx context.Context) (prune.Counts, error) {
	n, err := prune.Run(ctx, r.db, r.cfg)
	if n.Total() > 0 {
		r.log.Info("history pruned", "older_than", r.cfg.OlderThan, "rows", n.Total(),
			"messages", n["messages"], "receipts", n["receipts"], "inbox", n["inbox"])
	}
	return n, err
}

// Start runs RunOnce at once and then every min(1 min, the retention),
// until Stop; a failed pass is logged and retried at the next.
func (r *Pruner) Start(ctx context.Context) error {
	every := min(period, r.cfg.OlderThan)
	return r.life.Start(ctx, func(run *service.Run) {
		run.Every(0, func(ctx context.Context) time.Duration {
			if _, err := r.RunOnce(ctx); err != nil && ctx.Err() == nil {
				r.log.Warn("pruning history failed; retried at the next pass", "err", err, "every", every)
			}
			return every
		})
	})
}

// Stop stops the passes; a pass in flight is cancelled (its DELETEs are
// each a transaction: what committed stays).
func (r *Pruner) Stop(ctx context.Context) error { return r.life.Stop(ctx) }
