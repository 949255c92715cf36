// Package relaypass runs the passes of an outbox relay: one transaction
// that claims a table's next unsent rows from its claim floor
// (internal/claimfloor), hands them to the relay's publish, deletes the
// published rows (or counts a failure on the row the publish blamed) and
// commits, in two round trips besides the publish; and the shared pass of
// a relay group, the same for several tables in one transaction.
//
// Package outbox wraps it with its Relay and RelayGroup: the rows' type,
// the Publisher, the events and the log lines about them are its own and
// reach this package only through Table's functions and the Hooks of each
// pass.
package relaypass

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/outbox/internal/claimfloor"
	"github.com/outboxchat/outboxchat/outbox/internal/outboxsql"
)

// Internal bounds (not configurable).
const (
	recordMax    = 2 * time.Second // bound on recording a failure
	lastErrorMax = 1000            // bytes of last_error kept
)

// Table is one relay's side of its passes, for rows of type M. Set every
// exported field before the first pass and change none after; Floor and
// the time of the last pass are kept here. Must not be copied after first
// use. Safe for concurrent use: passes on one table serialise on its row
// locks.
type Table[M any] struct {
	// Pool runs the passes of Run (RunShared is given its own).
	Pool *pgxpool.Pool
	// SQL holds the table's statements; Quoted its quoted name.
	SQL    outboxsql.Relay
	Quoted string
	// BatchSize is the most rows one claim takes (≥ 1).
	BatchSize int
	// Timeouts are the lock_timeout, statement_timeout and
	// idle_in_transaction_session_timeout of every pass's transaction, as
	// PostgreSQL durations (Millis).
	Timeouts [3]string
	// MaxAttempts, BackoffMin and BackoffMax go to the Fail statement
	// (outboxsql.Relay.Fail): parking at MaxAttempts failures of a row's
	// own (≤ 0: never), and its backoff.
	MaxAttempts            int
	BackoffMin, BackoffMax time.Duration
	// Scan reads one claimed row into m, and into wait how long (s) the
	// row still waits after a failure of its own; RowID returns m's id.
	Scan  func(rows pgx.Rows, m *M, wait *float64) error
	RowID func(m *M) int64
	// Log receives a warning when a pass published a row below the claim
	// floor, and Debug lines about failed records.
	Log *slog.Logger
	// Floor is the table's claim floor.
	Floor claimfloor.Floor

	lastPass atomic.Int64 // unix nanoseconds of the last committed pass
}

// LastPass returns when the latest pass committed (an empty one too), by
// this process's clock; zero before the first. Safe for concurrent use.
func (t *Table[M]) LastPass() time.Time {
	if ns := t.lastPass.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// Hooks are the relay's part in one pass: Claimed (when rows were claimed,
// before Publish), Publish, then exactly one of Failed and Done. They are
// called from the goroutine that runs the pass, Publish of a shared pass
// from one goroutine per member, side by side.
type Hooks[M any] interface {
	// Claimed reports n ≥ 1 claimed rows, before they are published.
	Claimed(n int)
	// Publish publishes msgs (outbox order) within its own deadline.
	Publish(ctx context.Context, msgs []M) Published
	// Failed reports a failed pass: stage is "claim", "publish" or
	// "mark_sent", err wraps why ("outbox: relay: <stage>: ..."). Its rows
	// stay unsent.
	Failed(stage string, err error)
	// Done reports a committed pass.
	Done(Result[M])
}

// Published is the outcome of a pass's Publish: Err for a failure of the
// whole call (nothing counts as published), or K ≥ 0 for the row the
// publish blamed (PoisonID its id, PoisonErr why): the rows before it were
// published. K is -1 when no row was blamed.
type Published struct {
	Err       error
	K         int
	PoisonID  int64
	PoisonErr error
}

// Result is what a committed pass did.
type Result[M any] struct {
	// N is the number of rows published and deleted.
	N int
	// Wait > 0: the pass stopped at a row waiting this long after a
	// failure of its own.
	Wait time.Duration
	// Took is the pass's duration, claim to commit.
	Took time.Duration
	// Blamed is the row the publish blamed (nil: none), BlameErr why;
	// Failures its failures of its own so far (≥ 1) and Parked whether it
	// has now been parked.
	Blamed   *M
	BlameErr error
	Failures int
	Parked   bool
}

// Pass is one relay's pass and the state it keeps while it runs: set
// Table and Hooks, then give it to Run or, with others, to RunShared. A
// Pass is used once.
type Pass[M any] struct {
	Table *Table[M]
	Hooks Hooks[M]

	start   time.Time
	floor   int64
	wantXid bool
	h       horizon
	c       claim[M]
	pub     Published
	m       marked
}

// horizon is what a pass read before its claim, for the claim floor: the
// sequence's last value v, then its snapshot's xmin.
type horizon struct{ v, xmin int64 }

// claim is what a pass does with the rows its claim returned: it publishes
// msgs (the rows before the first one still waiting after a failure of its
// own: nothing behind it overtakes it) and deletes ids. The floor may then
// move past lastID, the last row the pass accounts for, and past the end of
// the claim when full (a full claim, or one cut short).
type claim[M any] struct {
	msgs   []M
	ids    []int64
	wait   time.Duration // > 0: the pass stopped at a row waiting this long
	full   bool
	lastID int64
}

// marked is what the Fail statement returned for a blamed row.
type marked struct {
	failures int
	parked   bool
}

// Run runs p's pass alone, in a transaction of its own, and ends it with
// p.Hooks' Failed or Done. A failed Publish (or deletion) rolls the
// transaction back and then records attempts+1 and last_error on the
// claimed rows in a short transaction of its own (best effort). ctx
// cancels the pass.
func Run[M any](ctx context.Context, p *Pass[M]) {
	t := p.Table
	p.start, p.pub.K = time.Now(), -1
	conn, err := t.Pool.Acquire(ctx)
	if err != nil {
		p.Hooks.Failed("claim", fmt.Errorf("outbox: relay: claim: acquire connection: %w", err))
		return
	}
	defer conn.Release() // destroys the connection if a transaction is left open

	inTx := false
	defer rollbackOpen(ctx, conn, &inTx)

	p.floor, p.wantXid = t.Floor.Start(p.start)
	b := &pgx.Batch{}
	b.Queue(outboxsql.Seq, t.Quoted)
	queueTxStart(b, t.Timeouts)
	b.Queue(t.SQL.Claim, t.BatchSize, p.floor)
	br := conn.SendBatch(ctx, b)
	inTx = true
	err = p.readClaim(br)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		p.Hooks.Failed("claim", fmt.Errorf("outbox: relay: claim: %w", err))
		return
	}
	if len(p.c.msgs) == 0 {
		if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
			p.Hooks.Failed("claim", fmt.Errorf("outbox: relay: claim: commit empty pass: %w", err))
			return
		}
		inTx = false
		p.done(0)
		return
	}
	p.Hooks.Claimed(len(p.c.msgs))
	p.pub = p.Hooks.Publish(ctx, p.c.msgs)
	if p.pub.Err != nil {
		t.rollbackAndRecord(ctx, conn, &inTx, p.c.ids, p.pub.Err)
		p.Hooks.Failed("publish", p.pub.Err)
		return
	}
	p.blame()
	b = &pgx.Batch{}
	p.queueMark(b)
	if p.wantXid {
		// The xid the claim's row locks gave this transaction, after the
		// sequence read: the floor's R (internal/claimfloor).
		b.Queue(outboxsql.Xid)
	}
	b.Queue("COMMIT")
	br = conn.SendBatch(ctx, b)
	err = p.readMark(br)
	var xid int64
	if err == nil && p.wantXid {
		err = br.QueryRow().Scan(&xid)
	}
	if err == nil {
		err = readCommit(br)
	}
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		err = fmt.Errorf("outbox: relay: mark %d rows sent: %w", len(p.c.ids), err)
		t.rollbackAndRecord(ctx, conn, &inTx, p.c.ids, err)
		p.Hooks.Failed("mark_sent", err)
		return
	}
	inTx = false
	p.done(xid)
}

// account turns a claim's rows and their waits into what the pass
// publishes.
func (p *Pass[M]) account(claimed []M, waits []time.Duration) {
	t := p.Table
	c := claim[M]{msgs: claimed, full: len(claimed) == t.BatchSize}
	for i, w := range waits {
		if w > 0 {
			c.msgs, c.wait = claimed[:i], w
			c.full, c.lastID = true, t.RowID(&claimed[i])-1
			break
		}
	}
	if c.wait == 0 && len(claimed) > 0 {
		c.lastID = t.RowID(&claimed[len(claimed)-1])
	}
	c.ids = make([]int64, len(c.msgs))
	for i := range c.msgs {
		c.ids[i] = t.RowID(&c.msgs[i])
	}
	p.c = c
}

// blame narrows the claim to the rows published before a blamed row: only
// those are deleted, and the floor stops before the blamed row.
func (p *Pass[M]) blame() {
	if p.pub.K >= 0 {
		p.c.ids = p.c.ids[:p.pub.K]
		p.c.full, p.c.lastID = true, p.pub.PoisonID-1
	}
}

// queueMark queues the deletion of the published rows and, for a blamed
// row, its failure (the Fail statement).
func (p *Pass[M]) queueMark(b *pgx.Batch) {
	t := p.Table
	b.Queue(t.SQL.Mark, p.c.ids)
	if p.pub.K >= 0 {
		b.Queue(t.SQL.Fail, p.pub.PoisonID, lastError(p.pub.PoisonErr), t.BackoffMin.Milliseconds(),
			t.BackoffMax.Milliseconds(), t.MaxAttempts)
	}
}

// readMark reads the results of queueMark's statements.
func (p *Pass[M]) readMark(br pgx.BatchResults) (err error) {
	if _, err = br.Exec(); err == nil && p.pub.K >= 0 {
		err = br.QueryRow().Scan(&p.m.failures, &p.m.parked)
	}
	return err
}

// done records a committed pass (its xid when it read one, for the floor;
// 0 otherwise) and reports it to Hooks.Done.
func (p *Pass[M]) done(xid int64) {
	t, c := p.Table, &p.c
	t.lastPass.Store(time.Now().UnixNano())
	old := t.Floor.Advance(p.floor, p.h.v, p.h.xmin, xid, c.full, c.lastID)
	res := Result[M]{N: len(c.ids), Wait: c.wait, Took: time.Since(p.start)}
	if len(c.msgs) == 0 {
		p.Hooks.Done(res)
		return
	}
	if first := t.RowID(&c.msgs[0]); p.floor == 0 && first < old && p.pub.K != 0 {
		t.Log.Warn("published a row below the claim floor; an outbox writer breaks the floor's assumptions (explicit ids, sequence CACHE > 1?): order across such rows is not guaranteed",
			slog.Int64("row_id", first), slog.Int64("floor", old))
	}
	if p.pub.K >= 0 {
		res.Blamed, res.BlameErr = &c.msgs[p.pub.K], p.pub.PoisonErr
		res.Failures, res.Parked = p.m.failures, p.m.parked
	}
	p.Hooks.Done(res)
}

// Millis renders d as a PostgreSQL duration setting in whole milliseconds
// (at least 1 ms; 0 would mean "no timeout"), for Table.Timeouts.
func Millis(d time.Duration) string {
	ms := d.Milliseconds()
	if ms < 1 {
		ms = 1
	}
	return strconv.FormatInt(ms, 10) + "ms"
}

// lastError renders err for the last_error column: at most 1000 bytes of
// valid UTF-8 without NUL (text columns reject both).
func lastError(err error) string {
	msg := strings.ReplaceAll(err.Error(), "\x00", "")
	if len(msg) > lastErrorMax {
		msg = msg[:lastErrorMax]
	}
	return strings.ToValidUTF8(msg, "")
}

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
	msg := lastError(cause)
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
