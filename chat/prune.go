package chat

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/internal/service"
)

// Watermark pruning.
//
// A receiver's inbox batch inserts a row into <service>.inbox_watermarks
// for each chat whose watermark it advanced (receipt.go) and never updates
// or deletes one, so that no row is written by every batch. The rows below
// each chat's newest are garbage; the pruner deletes them in the
// background, a bounded batch per statement.

// Defaults of the watermark pruner.
const (
	// DefaultPruneInterval is how often the pruner runs: about one row
	// per chat per inbox batch accumulates meanwhile (at 4,000 msg/s and
	// 10 s, some 40,000 rows, 3.5 MB).
	DefaultPruneInterval = 10 * time.Second
	// DefaultPruneBatch bounds the rows one DELETE removes, so each
	// transaction is short.
	DefaultPruneBatch = 10000
)

// watermarkPruner deletes superseded inbox_watermarks rows of one service.
// Start/Stop follow internal/service's contract; safe for concurrent use.
type watermarkPruner struct {
	pool     *pgxpool.Pool
	log      *slog.Logger
	interval time.Duration
	batch    int
	query    string
	life     service.Lifecycle
}

func newWatermarkPruner(pool *pgxpool.Pool, svc string, log *slog.Logger) (*watermarkPruner, error) {
	if err := checkService(svc); err != nil {
		return nil, err
	}
	if pool == nil {
		return nil, errors.New("chat: watermark pruner needs a pool")
	}
	if log == nil {
		log = slog.Default()
	}
	s := pgx.Identifier{svc}.Sanitize()
	return &watermarkPruner{
		pool: pool, log: log.With("component", "chat.prune"),
		interval: DefaultPruneInterval, batch: DefaultPruneBatch,
		// A row goes once a higher row of its chat is committed (the
		// newest of each chat, which the inbox reads, is never deleted).
		// SKIP LOCKED: another pruner (another worker process) has it.
		// By ctid, so the delete is a TID scan whatever the planner
		// thinks of the table's size.
		query: `DELETE FROM ` + s + `.inbox_watermarks WHERE ctid = ANY (ARRAY(
				SELECT w.ctid FROM ` + s + `.inbox_watermarks w
				WHERE EXISTS (SELECT 1 FROM ` + s + `.inbox_watermarks n
					WHERE n.chat_id = w.chat_id AND n.upto > w.upto)
				LIMIT $1 FOR UPDATE SKIP LOCKED))`,
		life: service.Lifecycle{Name: "chat: watermark pruner"},
	}, nil
}

// RunOnce deletes superseded rows, batch by batch, until a batch deletes
// fewer than the batch size. It returns how many rows it deleted.
func (p *watermarkPruner) RunOnce(ctx context.Context) (int64, error) {
	var total int64
	for {
		tag, err := p.pool.Exec(ctx, p.query, p.batch)
		if err != nil {
			return total, fmt.Errorf("prune watermarks: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(p.batch) {
			return total, nil
		}
	}
}

// Start runs RunOnce every interval until Stop (or ctx's end, a hard stop).
// It does not block.
func (p *watermarkPruner) Start(ctx context.Context) error {
	return p.life.Start(ctx, func(run *service.Run) {
		run.Every(p.interval, func(ctx context.Context) time.Duration {
			if _, err := p.RunOnce(ctx); err != nil && ctx.Err() == nil {
				p.log.Warn("watermark prune failed; retried at the next interval", "err", err)
			}
			return p.interval
		})
	})
}

// Stop ends the loop after the statement in flight. Idempotent.
func (p *watermarkPruner) Stop(ctx context.Context) error { return p.life.Stop(ctx) }
