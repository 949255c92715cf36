// Package prune deletes a service's chat history older than a cutoff (Run),
// in bounded DELETEs, keeping what a chat's seq, watermark and receipts
// need: the retention service and `outboxchat prune` run it.
package prune

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxchat/outboxchat/chat"
)

// DefaultBatch is the most rows one DELETE of Run takes
// (Config.Batch): small enough that each statement holds its row
// locks briefly and a send of the same chat waits at most for one batch.
const DefaultBatch = 1000

// Tables are the tables Run deletes from, in the order it does, as
// Counts keys and metric labels.
var Tables = []string{"messages", "receipts", "inbox", "inbox_gap_fills", "inbox_duplicates", "seq_floors"}

// Counts is the number of rows Run deleted, by table (every
// Tables key present).
type Counts map[string]int64

// Total is the sum of c's counts.
func (c Counts) Total() int64 {
	var n int64
	for _, v := range c {
		n += v
	}
	return n
}

// Config says what Run deletes.
type Config struct {
	// Service is chat.Consumers or chat.Workers: the schema pruned.
	Service string
	// OlderThan: rows whose time (created_at, delivered_at, received_at,
	// seen_at) is more than this before the database's now() go. Must be
	// above 0.
	OlderThan time.Duration
	// Batch bounds each DELETE (DefaultBatch when 0).
	Batch int
	// Deleted, when set, is called after each DELETE that took rows, with
	// the table and the count.
	Deleted func(table string, n int64)
}

// ErrInvalid is wrapped by Run's errors for a bad Config.
var ErrInvalid = errors.New("invalid prune")

// pruneStatements are the bounded DELETEs of schema s, by table. $1 is the
// cutoff (now() - OlderThan), $2 the batch size. What they keep, and why:
//
//   - messages: only messages covered by the chat's newest receipt go (the
//     rest may still need the re-drive); their seq stays taken by the floor
//     the delete trigger records (migration 008).
//   - receipts: never the chat's newest (the send numbers above it, the
//     re-drive and the history read it).
//   - inbox: only rows with every lower seq stored (not held, or covered by
//     the newest gap fill): the delete trigger then records the floor that
//     keeps the watermark; rows held behind a gap stay until it is filled.
//   - inbox_gap_fills and seq_floors: every row below the chat's newest (the
//     newest is the only one read); they have no time of their own.
//   - inbox_duplicates: by seen_at.
//
// Each picks at most $2 rows and deletes them by key; messages go before
// receipts, so a message that stays keeps the receipt that dates it. No
// table has an index on its time (one would cost every insert): a pick
// scans from the start of the table, where the oldest rows are, and stops
// at $2 matches, each with one index probe of the chat's newest receipt or
// gap fill.
func pruneStatements(s string) map[string]string {
	return map[string]string{
		"messages": `DELETE FROM ` + s + `.messages WHERE id IN (SELECT m.id FROM ` + s + `.messages m
			WHERE m.created_at < $1 AND m.seq <= coalesce((SELECT r.upto_seq FROM ` + s + `.receipts r
				WHERE r.chat_id = m.chat_id ORDER BY r.upto_seq DESC LIMIT 1), 0)
			LIMIT $2)`,
		"receipts": `DELETE FROM ` + s + `.receipts WHERE (chat_id, upto_seq) IN (SELECT d.chat_id, d.upto_seq FROM ` + s + `.receipts d
			WHERE d.delivered_at < $1 AND d.upto_seq < (SELECT r.upto_seq FROM ` + s + `.receipts r
				WHERE r.chat_id = d.chat_id ORDER BY r.upto_seq DESC LIMIT 1)
			LIMIT $2)`,
		"inbox": `DELETE FROM ` + s + `.inbox WHERE message_id IN (SELECT i.message_id FROM ` + s + `.inbox i
			WHERE i.received_at < $1 AND (NOT i.held OR i.seq <= coalesce((SELECT g.upto FROM ` + s + `.inbox_gap_fills g
				WHERE g.chat_id = i.chat_id ORDER BY g.upto DESC LIMIT 1), 0))
			LIMIT $2)`,
		"inbox_gap_fills": `DELETE FROM ` + s + `.inbox_gap_fills WHERE (chat_id, upto) IN (SELECT d.chat_id, d.upto FROM ` + s + `.inbox_gap_fills d
			WHERE d.upto < (SELECT g.upto FROM ` + s + `.inbox_gap_fills g WHERE g.chat_id = d.chat_id ORDER BY g.upto DESC LIMIT 1)
			AND $1::timestamptz IS NOT NULL
			LIMIT $2)`,
		"inbox_duplicates": `DELETE FROM ` + s + `.inbox_duplicates WHERE ctid IN (SELECT ctid FROM ` + s + `.inbox_duplicates
			WHERE seen_at < $1 LIMIT $2)`,
		"seq_floors": `DELETE FROM ` + s + `.seq_floors WHERE (chat_id, seq) IN (SELECT d.chat_id, d.seq FROM ` + s + `.seq_floors d
			WHERE d.seq < (SELECT f.seq FROM ` + s + `.seq_floors f WHERE f.chat_id = d.chat_id ORDER BY f.seq DESC LIMIT 1)
			AND $1::timestamptz IS NOT NULL
			LIMIT $2)`,
	}
}

// DB is what Run runs on: a *pgxpool.Pool, *pgx.Conn or pgx.Tx.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Run deletes cfg.Service's history older than cfg.OlderThan, table by
// table (Tables order), in DELETEs of at most cfg.Batch rows each (each
// its own transaction on db), until a DELETE takes fewer than a batch. It
// keeps what a chat's seq, watermark and receipts need (see
// pruneStatements): a chat keeps numbering on and receiving after it. It
// returns the rows deleted by table, also when it stops early on an error
// or ctx. Errors: a bad cfg (ErrInvalid), a failed statement.
func Run(ctx context.Context, db DB, cfg Config) (Counts, error) {
	if err := chat.CheckService(cfg.Service); err != nil {
		return nil, err
	}
	if cfg.OlderThan <= 0 {
		return nil, fmt.Errorf("%w: older than %v, want above 0", ErrInvalid, cfg.OlderThan)
	}
	if cfg.Batch < 0 {
		return nil, fmt.Errorf("%w: batch %d < 0", ErrInvalid, cfg.Batch)
	}
	batch := cfg.Batch
	if batch == 0 {
		batch = DefaultBatch
	}
	counts := Counts{}
	for _, t := range Tables {
		counts[t] = 0
	}
	var cutoff time.Time
	if err := db.QueryRow(ctx, `SELECT now() - $1::interval`, cfg.OlderThan).Scan(&cutoff); err != nil {
		return counts, fmt.Errorf("prune: read the cutoff: %w", err)
	}
	sts := pruneStatements(pgx.Identifier{cfg.Service}.Sanitize())
	for _, t := range Tables {
		for {
			ct, err := db.Exec(ctx, sts[t], cutoff, batch)
			if err != nil {
				return counts, fmt.Errorf("prune %s.%s: %w", cfg.Service, t, err)
			}
			n := ct.RowsAffected()
			counts[t] += n
			if n > 0 && cfg.Deleted != nil {
				cfg.Deleted(t, n)
			}
			if n < int64(batch) {
				break
			}
		}
	}
	return counts, nil
}
