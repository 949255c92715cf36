package relaypass

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/outbox/internal/outboxsql"
)

// RunShared runs the passes ps (of distinct tables, at least one) as one
// shared pass on pool and ends each with its Hooks' Failed or Done. The
// members share the sequence read, the transaction (with the lock,
// statement and idle timeouts of ps[0]'s Table), its snapshot and its xid;
// each claims from its own table and floor in the order of ps, publishes
// its own rows (the Publish calls run side by side) and deletes them. A
// failed Publish fails its member's pass alone: its rows stay unsent and
// get attempts+1 and last_error in the shared transaction. A failure of
// the transaction itself fails every member's pass. ctx cancels the pass.
func RunShared[M any](ctx context.Context, pool *pgxpool.Pool, ps []*Pass[M]) {
	start := time.Now()
	failAll := func(stage string, err error) {
		for _, p := range ps {
			p.Hooks.Failed(stage, err)
		}
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		failAll("claim", fmt.Errorf("outbox: relay: claim: acquire connection: %w", err))
		return
	}
	defer conn.Release() // destroys the connection if a transaction is left open
	inTx := false
	defer rollbackOpen(ctx, conn, &inTx)

	// The sequence reads before BEGIN, so before the xid: internal/claimfloor.
	b := &pgx.Batch{}
	tables := make([]string, len(ps))
	for i, p := range ps {
		p.start, p.pub.K = start, -1
		p.floor, p.wantXid = p.Table.Floor.Start(start)
		tables[i] = p.Table.Quoted
	}
	b.Queue(outboxsql.Seqs, tables)
	queueTxStart(b, ps[0].Table.Timeouts)
	for _, p := range ps {
		b.Queue(p.Table.SQL.Claim, p.Table.BatchSize, p.floor)
	}
	br := conn.SendBatch(ctx, b)
	inTx = true
	err = readSharedClaim(br, ps)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		failAll("claim", fmt.Errorf("outbox: relay: claim: %w", err))
		return
	}

	// Every member publishes its own rows, side by side.
	var wg sync.WaitGroup
	rows, wantXid := false, false
	for _, p := range ps {
		if len(p.c.msgs) == 0 {
			continue
		}
		rows = true
		p.Hooks.Claimed(len(p.c.msgs))
		wg.Go(func() { p.pub = p.Hooks.Publish(ctx, p.c.msgs) })
	}
	wg.Wait()

	b = &pgx.Batch{}
	for _, p := range ps {
		switch {
		case len(p.c.msgs) == 0:
		case p.pub.Err != nil:
			// Its rows stay unsent; the failure is recorded on them here,
			// where they are still locked.
			b.Queue(p.Table.SQL.Record, p.c.ids, lastError(p.pub.Err))
		default:
			p.blame()
			p.queueMark(b)
			wantXid = wantXid || p.wantXid
		}
	}
	if wantXid {
		// The xid the claims' row locks gave this transaction, after the
		// sequence reads: the floors' R (internal/claimfloor).
		b.Queue(outboxsql.Xid)
	}
	b.Queue("COMMIT")
	br = conn.SendBatch(ctx, b)
	var xid int64
	err = readSharedMark(br, ps, wantXid, &xid)
	if err == nil {
		err = readCommit(br)
	}
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		stage := "mark_sent"
		if !rows {
			stage = "claim"
		}
		failAll(stage, fmt.Errorf("outbox: relay: mark rows sent (shared pass of %d tables): %w", len(ps), err))
		// The first record rolls the transaction back (the deferred
		// rollback does when no member claimed rows).
		for _, p := range ps {
			if len(p.c.ids) > 0 {
				p.Table.rollbackAndRecord(ctx, conn, &inTx, p.c.ids, err)
			}
		}
		return
	}
	inTx = false
	for _, p := range ps {
		switch {
		case len(p.c.msgs) == 0:
			p.done(0)
		case p.pub.Err != nil:
			p.Hooks.Failed("publish", p.pub.Err)
		case p.wantXid:
			p.done(xid)
		default:
			p.done(0)
		}
	}
}

// readSharedClaim reads the results of a shared pass's first round trip:
// the members' sequence reads, BEGIN, the snapshot read, set_config and
// each member's claim, into the members' horizons and claims.
func readSharedClaim[M any](br pgx.BatchResults, ps []*Pass[M]) error {
	rows, err := br.Query()
	if err != nil {
		return fmt.Errorf("read sequences: %w", err)
	}
	i := 0
	for rows.Next() {
		if i < len(ps) {
			err = rows.Scan(&ps[i].h.v)
		}
		i++
		if err != nil {
			break
		}
	}
	rows.Close()
	if err == nil {
		err = rows.Err()
	}
	if err == nil && i != len(ps) {
		err = fmt.Errorf("%d values for %d tables", i, len(ps))
	}
	if err != nil {
		return fmt.Errorf("read sequences: %w", err)
	}
	var xmin int64
	if err := readTxStart(br, &xmin); err != nil {
		return err
	}
	for _, p := range ps {
		p.h.xmin = xmin
		if err := p.readRows(br); err != nil {
			return err
		}
	}
	return nil
}

// readSharedMark reads the results of the members' deletions, failures and
// records, and the xid when it was read.
func readSharedMark[M any](br pgx.BatchResults, ps []*Pass[M], wantXid bool, xid *int64) error {
	for _, p := range ps {
		switch {
		case len(p.c.msgs) == 0:
		case p.pub.Err != nil:
			if _, err := br.Exec(); err != nil {
				return err
			}
		default:
			if err := p.readMark(br); err != nil {
				return err
			}
		}
	}
	if wantXid {
		return br.QueryRow().Scan(xid)
	}
	return nil
}
