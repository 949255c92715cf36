package relaypass

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/outbox/internal/outboxsql"
)

// queueTxStart queues a pass's BEGIN, snapshot read and set_config.
func queueTxStart(b *pgx.Batch, timeouts [3]string) {
	b.Queue("BEGIN")
	b.Queue(outboxsql.Snapshot)
	b.Queue(outboxsql.SetTimeouts, timeouts[0], timeouts[1], timeouts[2])
}

// readClaim reads the results of the sequence read, BEGIN, the snapshot
// read (into p.h), set_config and the claim query (into p.c).
func (p *Pass[M]) readClaim(br pgx.BatchResults) error {
	if err := br.QueryRow().Scan(&p.h.v); err != nil {
		return fmt.Errorf("read sequence: %w", err)
	}
	if err := readTxStart(br, &p.h.xmin); err != nil {
		return err
	}
	return p.readRows(br)
}

// readTxStart reads the results of a pass's BEGIN, snapshot read (into
// xmin) and set_config.
func readTxStart(br pgx.BatchResults, xmin *int64) error {
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if err := br.QueryRow().Scan(xmin); err != nil {
		return fmt.Errorf("read snapshot: %w", err)
	}
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("set timeouts: %w", err)
	}
	return nil
}

// readRows reads the rows of a claim query and how long each still waits,
// and accounts for them (p.c).
func (p *Pass[M]) readRows(br pgx.BatchResults) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	var msgs []M
	var waits []time.Duration
	for rows.Next() {
		var m M
		var wait float64
		if err := p.Table.Scan(rows, &m, &wait); err != nil {
			rows.Close()
			return fmt.Errorf("scan: %w", err)
		}
		msgs = append(msgs, m)
		waits = append(waits, time.Duration(wait*float64(time.Second)))
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	p.account(msgs, waits)
	return nil
}

// readCommit reads a COMMIT's result: a failed transaction answers it with
// ROLLBACK.
func readCommit(br pgx.BatchResults) error {
	tag, err := br.Exec()
	if err == nil && tag.String() != "COMMIT" {
		err = fmt.Errorf("commit ended in %q", tag.String())
	}
	return err
}

// rollbackAndRecord rolls back the pass's transaction and then, best effort,
// records the failure on the claimed rows in a short transaction of its own.
func (t *Table[M]) rollbackAndRecord(ctx context.Context, conn *pgxpool.Conn, inTx *bool, ids []int64, cause error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordMax)
	defer cancel()
	*inTx = false
	if !rollback(rctx, conn) {
		// The connection is gone; record on a fresh one.
		c2, err := t.Pool.Acquire(rctx)
		if err != nil {
			return
		}
		defer c2.Release()
		conn = c2
	}
	msg := LastError(cause)
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(outboxsql.SetTimeouts, t.Timeouts[0], t.Timeouts[1], t.Timeouts[2])
	b.Queue(t.SQL.Record, ids, msg)
	b.Queue("COMMIT")
	if err := conn.SendBatch(rctx, b).Close(); err != nil {
		t.Log.Debug("recording a failed pass failed", slog.Int("rows", len(ids)), slog.Any("err", err))
		_, _ = conn.Exec(rctx, "ROLLBACK")
	}
}

// rollbackOpen rolls back conn's transaction when *inTx says one is still
// open (a pass that returned early), within recordMax.
func rollbackOpen(ctx context.Context, conn *pgxpool.Conn, inTx *bool) {
	if *inTx {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordMax)
		rollback(rctx, conn)
		cancel()
	}
}

// rollback rolls back conn's transaction; a connection that cannot is
// closed (the pool drops it on Release) and rollback returns false.
func rollback(ctx context.Context, conn *pgxpool.Conn) bool {
	if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
		_ = conn.Conn().Close(ctx)
		return false
	}
	return true
}
