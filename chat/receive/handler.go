package receive

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/auth"
	"github.com/outboxchat/outboxchat/chat/schema"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxchat/outboxchat/inbox"
)

// InboxHandler is the chat's inbox.Handler: it records a message.created
// event from the other service in <service>.inbox, keyed by message id. A
// duplicate inserts nothing and is logged in <service>.inbox_duplicates
// instead. It sends no NOTIFY: the gateways of the service's other
// processes learn of the new rows from a Waker after the commit
// (inbox.Config.AfterCommit), or at their poll. It is safe for concurrent
// use.
type InboxHandler struct {
	service     string
	lockChats   string
	insertBatch string
	rq          receiptQueries
	cq          changeQueries // edits, deletes, read receipts (changes.go)
	// keys, when set, check every delivery's signature before anything
	// else (EventKeys.Verify on the inbound queue).
	keys *auth.EventKeys
	// receipted is set when a transaction's statements put a receipt in
	// this handler's partition's outbox (TakeReceiptQueued); each
	// ForPartition copy has its own.
	receipted *atomic.Bool
}

// ForPartition returns a copy of h for the stream of partition p
// (chat.PartitionQueue): the receipts of its batches are enqueued in the
// outbox of the same partition (chat.OutboxTable(service, p)), so that
// they travel back in the lane of their chats (QueueMerged sends the
// receipt of several partitions' batches through the first one's lane).
// ForPartition(0) is h's behaviour. The copy shares nothing mutable with h.
func (h *InboxHandler) ForPartition(p int) *InboxHandler {
	c := *h
	c.rq = newReceiptQueries(h.service, p)
	c.receipted = new(atomic.Bool)
	return &c
}

// TakeReceiptQueued reports whether a transaction queued by QueueBatch or
// QueueMerged since the last call put a receipt in this handler's
// partition's outbox, and clears the mark. It is set when the statements
// are queued, so after a transaction that failed it may report a receipt
// that was rolled back: its use is to wake that partition's relay after
// the commit (a wake-up too many costs an empty pass; one too few, the
// wait for the relay's next poll). Safe for concurrent use.
func (h *InboxHandler) TakeReceiptQueued() bool { return h.receipted.Swap(false) }

// ErrSeqConflict is wrapped (with inbox.ErrMalformed, so it is
// dead-lettered at once) by the result of a message whose (chat, seq) the
// inbox already holds under another message id: the sender handed that seq
// out twice (a restore or failover that lost its rows and floors). It
// cannot be stored and is not a duplicate, so it is dead-lettered, with a
// reason that starts with "seq conflict" and says which (chat, seq), and
// which message holds it when the handler knows. (Receipts are cumulative
// by seq: one covering that seq still tells the sender it was delivered.)
var ErrSeqConflict = errors.New("seq conflict")

// NewInboxHandler returns the handler for service's inbox. With keys non-nil it
// refuses, as malformed (dead-lettered with the reason, before the inbox is
// touched), every delivery whose signature is missing or does not match
// keys for the inbound queue; nil keys: signatures are not checked. Error:
// an unknown service (chat.ErrUnknownService).
func NewInboxHandler(service string, keys *auth.EventKeys) (*InboxHandler, error) {
	if err := chat.CheckService(service); err != nil {
		return nil, err
	}
	s := pgx.Identifier{service}.Sanitize()
	return &InboxHandler{
		service:   service,
		keys:      keys,
		receipted: new(atomic.Bool),
		rq:        newReceiptQueries(service, 0),
		cq:        newChangeQueries(service),
		// lockChats takes, in the order given (ascending, so two inbox
		// transactions cannot deadlock), a transaction advisory lock per
		// chat of the batch's messages: hashtextextended('<service>.inbox.'
		// || chat, 0). Two inbox consumers (two worker processes) storing
		// the same chat then take turns, and the second one's insert and
		// receipt see the first one's rows: without it, both could compute
		// their receipt before either committed, each missing the other's
		// row, and the chat's receipt stayed below its top until its next
		// message or the re-drive's copy (a property test saw it 7 times
		// in 20 seeds). A single consumer never waits on it.
		lockChats: `SELECT count(pg_advisory_xact_lock(` + schema.InboxLockSQL(service, "c") + `))
			FROM unnest($1::bigint[]) AS c`,
		// The whole batch in one statement: insert the rows, record the
		// duplicates ($7: ids already known to repeat inside the batch, plus
		// those that hit an existing row), and return the new ids. No
		// NOTIFY: one inside the transaction would take the cluster-wide
		// notify lock at commit and hold it through the commit's WAL flush,
		// so that every notifying commit of the database waited for the
		// others' fsyncs; the Waker notifies after the commit instead.
		//
		// A delivery at or below the chat's floor (its newest gap fill:
		// every seq up to it has been stored, migration 008) is not
		// inserted: its row is there (a duplicate) or was deleted since (a
		// copy of a message already received, a duplicate too). Only a
		// delivery not inserted is then looked up by (chat, seq): held by
		// another message id, it is a conflict, returned with that id and
		// not counted as a duplicate (the handler dead-letters it);
		// otherwise a duplicate. A conflict above the floor fails the
		// insert on UNIQUE (chat_id, seq) instead (23505, mapped to
		// ErrSeqConflict; the consumer then retries the batch one delivery
		// at a time and dead-letters that one): ON CONFLICT on that key as
		// well would make each insert probe both unique indexes first,
		// in lab bench, about 3 % of the throughput. So the common path
		// adds no probe per message.
		//
		// A row is stored held (behind a gap) unless every seq below it has
		// been in the inbox: the batch's rows of a chat, in seq order, up to
		// its first gap, are not held when the first of them is seq 1, its
		// predecessor is stored and not held, or it is right above the
		// chat's floor (migrations 007, 008). A row held behind a gap that
		// an earlier or concurrent batch fills is counted by the receipts'
		// emit (receiptsql.go), which runs next in the transaction.
		// The probes are scalar subqueries, not EXISTS: a plan cached while
		// the inbox was empty turned EXISTS into a hashed scan of the
		// whole table.
		insertBatch: `WITH a AS (SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::bigint[], $4::text[], $5::text[], $6::timestamptz[], $8::text[], $9::text[], $10::text[])
				AS a(id, chat, seq, body, sender, sent_at, author, tp, ref)),
			fl AS MATERIALIZED (SELECT y.chat, coalesce((SELECT g.upto FROM ` + s + `.inbox_gap_fills g
					WHERE g.chat_id = y.chat ORDER BY g.upto DESC LIMIT 1), 0) AS fill
				FROM (SELECT DISTINCT chat FROM a) y),
			u AS (SELECT a.*, fl.fill FROM a JOIN fl USING (chat) WHERE a.seq > fl.fill),
			f AS (SELECT chat, first, first = 1 OR coalesce((SELECT NOT p.held
					FROM ` + s + `.inbox p WHERE p.chat_id = x.chat AND p.seq = x.first - 1), false) OR first - 1 <= fill AS base
				FROM (SELECT chat, min(seq) AS first, max(fill) AS fill FROM u GROUP BY chat) x),
			r AS (SELECT u.*, NOT (f.base AND u.seq - f.first = row_number() OVER (PARTITION BY u.chat ORDER BY u.seq) - 1) AS held
				FROM u JOIN f USING (chat)),
		ins AS (
			INSERT INTO ` + s + `.inbox (message_id, chat_id, seq, body, sender, sent_at, author, held, traceparent, stream_id)
			SELECT r.id, r.chat, r.seq, r.body, r.sender, r.sent_at, NULLIF(r.author, ''), r.held, NULLIF(r.tp, ''), NULLIF(r.ref, '') FROM r
			ON CONFLICT (message_id) DO NOTHING RETURNING message_id, chat_id, received_at),
		k AS MATERIALIZED (SELECT a.id, (SELECT t.message_id FROM ` + s + `.inbox t WHERE t.chat_id = a.chat AND t.seq = a.seq) AS taken
				FROM a WHERE a.id NOT IN (SELECT message_id FROM ins)),
		dup AS (INSERT INTO ` + s + `.inbox_duplicates (message_id)
			SELECT k.id FROM k WHERE k.taken IS NULL OR k.taken = k.id
			UNION ALL SELECT u FROM unnest($7::uuid[]) AS u)
		SELECT message_id::text, received_at, '' FROM ins
		UNION ALL SELECT k.id::text, now(), k.taken::text FROM k
			WHERE k.taken <> k.id`,
	}, nil
}

// verify checks d's signature when the handler requires signatures
// (RequireSignatures). Errors wrap inbox.ErrMalformed.
func (h *InboxHandler) verify(d inbox.Delivery) error {
	if h.keys == nil {
		return nil
	}
	if err := h.keys.Verify(chat.QueueName(chat.Peer(h.service)), d); err != nil {
		return fmt.Errorf("%w: %w", inbox.ErrMalformed, err)
	}
	return nil
}

// decodeReceipt checks a receipt delivery without touching the database: a
// valid receipt from the other service whose id is the job id. Errors wrap
// inbox.ErrMalformed.
func (h *InboxHandler) decodeReceipt(d inbox.Delivery) (chat.Receipt, error) {
	r, err := chat.DecodeReceipt(d.Payload)
	return r, h.checkDecoded(d, "receipt", r.ID, r.From, err)
}

// decode checks a delivery without touching the database: a job named
// message.created holding a valid event from the other service whose id is
// the job id. Errors wrap inbox.ErrMalformed.
func (h *InboxHandler) decode(d inbox.Delivery) (chat.Message, error) {
	if d.Name != chat.EventMessageCreated {
		return chat.Message{}, fmt.Errorf("%w: event %q, expected %q, %q or %q", inbox.ErrMalformed, d.Name, chat.EventMessageCreated, chat.EventReceipt, chat.EventSeqFloor)
	}
	m, err := chat.DecodeEvent(d.Payload)
	return m, h.checkDecoded(d, "message", m.ID, m.From, err)
}

// checkDecoded checks what decode and decodeReceipt share: the payload
// decoded (err nil), the job id, if any, is the payload's (what's) id, and
// from is the other service. Errors wrap inbox.ErrMalformed.
func (h *InboxHandler) checkDecoded(d inbox.Delivery, what, id, from string, err error) error {
	switch {
	case err != nil:
		return fmt.Errorf("%w: %v", inbox.ErrMalformed, err)
	case d.ID != "" && d.ID != id:
		return fmt.Errorf("%w: job id %q differs from %s id %q", inbox.ErrMalformed, d.ID, what, id)
	case from != chat.Peer(h.service):
		return fmt.Errorf("%w: %s from %q, expected %q", inbox.ErrMalformed, what, from, chat.Peer(h.service))
	}
	return nil
}

// Apply implements inbox.Handler as a one-delivery ApplyBatch. A payload
// that is not a valid message.created event from the other service returns
// an error wrapping inbox.ErrMalformed without touching tx.
func (h *InboxHandler) Apply(ctx context.Context, tx pgx.Tx, d inbox.Delivery) (bool, error) {
	rs, err := h.ApplyBatch(ctx, tx, []inbox.Delivery{d})
	if err != nil {
		return false, err
	}
	return rs[0].Fresh, rs[0].Err
}

// ApplyBatch implements inbox.BatchHandler: the same effect as Apply on each
// delivery in order, in one round trip for the whole batch (QueueBatch's
// statement, sent on tx). The result of a fresh delivery carries the stored
// Message (ReceivedAt set) as its Value, for inbox.Config.AfterCommit.
func (h *InboxHandler) ApplyBatch(ctx context.Context, tx pgx.Tx, ds []inbox.Delivery) ([]inbox.BatchResult, error) {
	rs := make([]inbox.BatchResult, len(ds))
	b := &pgx.Batch{}
	if err := h.QueueBatch(b, ds, rs); err != nil {
		return nil, err
	}
	if b.Len() == 0 {
		return rs, nil
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, err
	}
	return rs, nil
}

// QueueBatch implements inbox.PipelineHandler: it decodes ds (a malformed
// delivery's result gets its error) and queues up to four statements:
// for the messages, one that locks their chats (in chat order), one that
// inserts the new rows and records duplicates, then one that enqueues a receipt for the
// chats of those messages in the service's own outbox (see receipt.go); for the
// receipts (EventReceipt deliveries), one that records them in the
// service's receipts table (a row per chat they advance; the covered
// messages' delivered_at is derived from it). It fills the results from their rows: a
// message is Fresh when its row is new (Value: the stored Message), a
// receipt always (Value: the Receipt). It queues nothing when every
// delivery is malformed.
func (h *InboxHandler) QueueBatch(b *pgx.Batch, ds []inbox.Delivery, rs []inbox.BatchResult) error {
	queueBatches(b, []*inboxBatch{h.decodeBatch(ds, rs)})
	return nil
}

// QueueMerged implements inbox.MergeHandler: the batches of several
// partitions' consumers in one shared inbox transaction (inbox.Group), with
// the statements QueueBatch queues for each, except that their messages
// share one lock statement (all their chats, in chat order) and one insert,
// the receipts they carry one statement, and the receipt they send back
// one event (up to chat.MaxReceiptChats chats), enqueued in the outbox of
// the partition of the first batch that stored messages or seq floors
// (TakeReceiptQueued says which handler's got one). hs must be
// InboxHandlers of one service (ForPartition copies); error: another
// handler, before anything is queued.
func (h *InboxHandler) QueueMerged(b *pgx.Batch, hs []inbox.PipelineHandler, ds [][]inbox.Delivery, rs [][]inbox.BatchResult) error {
	bts := make([]*inboxBatch, len(hs))
	for i, ph := range hs {
		m, ok := ph.(*InboxHandler)
		if !ok || m.service != h.service {
			return fmt.Errorf("chat: merging inbox batches: handler %d is a %T of another service or kind", i, ph)
		}
		bts[i] = m.decodeBatch(ds[i], rs[i])
	}
	queueBatches(b, bts)
	return nil
}

// inboxBatch is one batch's deliveries, decoded, before its statements are
// queued: the columns of its messages (idx: each one's delivery index),
// the receipts and seq floors it carries, and its changes.
type inboxBatch struct {
	h  *InboxHandler
	rs []inbox.BatchResult

	ids                                 []pgtype.UUID
	bodies, senders, authors, tps, refs []string
	chats, seqs                         []int64
	sentAts                             []time.Time
	idx                                 []int
	repeats                             []pgtype.UUID
	traced                              string // the first traceparent of the batch's messages: the receipt's
	msgs                                []chat.Message
	first                               map[string]int // message id → index of its first delivery

	rChats, rUpto []int64
	rAts          []time.Time
	fChats, fUpto []int64 // seq floors (floor.go)
	// Edits, deletes and read receipts (changes.go), queued after the
	// messages' statements so that a change finds its message of the same
	// batch.
	changes changeBatch
}

// decodeBatch decodes ds (a malformed delivery's result in rs gets its
// error; a receipt's and a seq floor's their outcome).
func (h *InboxHandler) decodeBatch(ds []inbox.Delivery, rs []inbox.BatchResult) *inboxBatch {
	// The message columns, sized for a batch of messages only (the usual
	// one): growing ten slices by appends cost more than the batch's
	// decoding of a row.
	n := len(ds)
	// The ids go as pgtype.UUID: pgx has no binary encoding of a string
	// as a uuid, and for a []string it first built an error (a formatted
	// copy of every id), then fell back to a text array that Postgres
	// parsed back. Not as [16]byte: pgx cannot write that as text, which
	// the exec and simple protocol modes (behind a transaction-mode
	// pooler) need.
	bt := &inboxBatch{h: h, rs: rs,
		ids:    make([]pgtype.UUID, 0, n),
		bodies: make([]string, 0, n), senders: make([]string, 0, n), authors: make([]string, 0, n),
		tps: make([]string, 0, n), refs: make([]string, 0, n),
		chats: make([]int64, 0, n), seqs: make([]int64, 0, n), sentAts: make([]time.Time, 0, n),
		idx: make([]int, 0, n), msgs: make([]chat.Message, n),
	}
	bt.first = make(map[string]int, n)
	for i, d := range ds {
		// Every delivery, message or receipt, is checked against the event
		// keys first: a forged receipt would otherwise mark messages
		// delivered and stop their re-drive.
		if err := h.verify(d); err != nil {
			rs[i].Err = err
			continue
		}
		if d.Name == chat.EventSeqFloor {
			r, err := h.decodeFloor(d)
			if err != nil {
				rs[i].Err = err
				continue
			}
			for _, c := range r.Chats {
				bt.fChats, bt.fUpto = append(bt.fChats, c.ChatID), append(bt.fUpto, c.UptoSeq)
			}
			// No Value: a chat.Receipt would be pushed as a receipt
			// (✓✓) by the gateway; without one it re-reads its rooms.
			rs[i].Fresh = true
			continue
		}
		if d.Name == chat.EventReceipt {
			r, err := h.decodeReceipt(d)
			if err != nil {
				rs[i].Err = err
				continue
			}
			for _, c := range r.Chats {
				bt.rChats, bt.rUpto, bt.rAts = append(bt.rChats, c.ChatID), append(bt.rUpto, c.UptoSeq), append(bt.rAts, r.ReceivedAt)
			}
			rs[i].Fresh, rs[i].Value = true, r
			continue
		}
		if isChangeEvent(d.Name) {
			bt.changes.add(h, d, i, rs)
			continue
		}
		m, err := h.decode(d)
		if err != nil {
			rs[i].Err = err
			continue
		}
		id, err := uuid.Parse(m.ID) // decode checked it is one
		if err != nil {
			rs[i].Err = fmt.Errorf("%w: id %q: %v", inbox.ErrMalformed, m.ID, err)
			continue
		}
		if _, seen := bt.first[m.ID]; seen {
			bt.repeats = append(bt.repeats, pgtype.UUID{Bytes: id, Valid: true}) // a duplicate inside the batch
			continue
		}
		bt.first[m.ID] = i
		bt.msgs[i] = m
		bt.ids, bt.chats, bt.seqs = append(bt.ids, pgtype.UUID{Bytes: id, Valid: true}), append(bt.chats, m.ChatID), append(bt.seqs, m.Seq)
		bt.bodies, bt.senders, bt.sentAts = append(bt.bodies, m.Body), append(bt.senders, m.From), append(bt.sentAts, m.SentAt)
		bt.authors, bt.idx = append(bt.authors, m.Author), append(bt.idx, i)
		// The message's trace context (migration 011): kept in its row for
		// the gateway's push, and sent back on the batch's receipt (one
		// receipt per batch, so it joins the trace of its first traced
		// message).
		tp := d.Headers[traceparentHeader]
		if !validTraceparent(tp) {
			tp = ""
		}
		bt.tps, bt.refs = append(bt.tps, tp), append(bt.refs, d.Ref)
		if bt.traced == "" {
			bt.traced = tp
		}
		bt.msgs[i].TraceParent = tp
	}
	return bt
}

// msgRef names a message of one of the batches queueBatches merges.
type msgRef struct {
	bt *inboxBatch
	i  int // delivery index
}

// queueBatches queues the statements of bts, which share one transaction:
// one statement applying the receipts of all, then one lock statement for
// all their chats (the messages' and the seq floors', in ascending order:
// two sets taken one after the other could deadlock with another
// consumer's), each one's floors, one insert of all their messages, one
// receipt emit for all (queueReceipts), each one's changes. It fills the
// results from the statements' rows.
func queueBatches(b *pgx.Batch, bts []*inboxBatch) {
	h := bts[0].h
	total, floors := 0, 0
	// The receipts table is the service's, whatever the partition: one
	// statement records the receipts of all.
	var rChats, rUpto []int64
	var rAts []time.Time
	for _, bt := range bts {
		rChats, rUpto, rAts = append(rChats, bt.rChats...), append(rUpto, bt.rUpto...), append(rAts, bt.rAts...)
		total, floors = total+len(bt.ids), floors+len(bt.fChats)
	}
	if len(rChats) > 0 {
		b.Queue(h.rq.apply, rChats, rUpto, rAts).Query(func(rows pgx.Rows) error {
			rows.Close()
			if err := rows.Err(); err != nil {
				return fmt.Errorf("apply receipts: %w", err)
			}
			return nil
		})
	}
	defer func() {
		for _, bt := range bts {
			bt.changes.queue(b)
		}
	}()
	if total == 0 && floors == 0 {
		return
	}
	// One batch (the usual case) goes as it is; several are merged into
	// one set of columns, a message met in an earlier batch counting as a
	// repeat.
	m := bts[0]
	var refs map[string]msgRef // merged: message id → its batch and delivery
	if len(bts) > 1 {
		refs = make(map[string]msgRef, total)
		m = &inboxBatch{}
		for _, bt := range bts {
			m.repeats = append(m.repeats, bt.repeats...)
			for j, i := range bt.idx {
				if _, seen := refs[bt.msgs[i].ID]; seen {
					m.repeats = append(m.repeats, bt.ids[j])
					continue
				}
				refs[bt.msgs[i].ID] = msgRef{bt, i}
				m.ids, m.chats, m.seqs = append(m.ids, bt.ids[j]), append(m.chats, bt.chats[j]), append(m.seqs, bt.seqs[j])
				m.bodies, m.senders, m.sentAts = append(m.bodies, bt.bodies[j]), append(m.senders, bt.senders[j]), append(m.sentAts, bt.sentAts[j])
				m.authors, m.tps, m.refs = append(m.authors, bt.authors[j]), append(m.tps, bt.tps[j]), append(m.refs, bt.refs[j])
			}
			m.fChats = append(m.fChats, bt.fChats...)
		}
	}
	lookup := func(id []byte) (msgRef, bool) {
		if refs == nil {
			i, ok := m.first[string(id)]
			return msgRef{m, i}, ok
		}
		ref, ok := refs[string(id)]
		return ref, ok
	}
	locks := append(slices.Clone(m.chats), m.fChats...)
	slices.Sort(locks)
	b.Queue(h.lockChats, slices.Compact(locks))
	for _, bt := range bts {
		if len(bt.fChats) > 0 {
			bt.h.queueFloors(b, bt.fChats, bt.fUpto)
		}
	}
	if len(m.ids) > 0 {
		b.Queue(h.insertBatch, m.ids, m.chats, m.seqs, m.bodies, m.senders, m.sentAts, m.repeats, m.authors, m.tps, m.refs).Query(func(rows pgx.Rows) error {
			// The ids are read as the driver's bytes (valid until the next
			// row) and only looked up: no string per row. The received
			// times share one array: no allocation per row either.
			var id, taken pgtype.DriverBytes
			ats := make([]time.Time, len(m.ids))
			k := 0
			for rows.Next() {
				var at time.Time
				if err := rows.Scan(&id, &at, &taken); err != nil {
					return fmt.Errorf("insert inbox batch: %w", err)
				}
				ref, ok := lookup(id)
				if !ok {
					continue
				}
				msg, rs := ref.bt.msgs[ref.i], ref.bt.rs
				if len(taken) > 0 {
					rs[ref.i].Err = fmt.Errorf("%w: %w: chat %d seq %d is already stored under message %s, not %s",
						inbox.ErrMalformed, ErrSeqConflict, msg.ChatID, msg.Seq, taken, msg.ID)
					continue
				}
				if k == len(ats) { // more new rows than messages: cannot be, but do not panic
					ats = append(ats, time.Time{})
				}
				ats[k] = at
				msg.ReceivedAt, msg.DeliveredAt = &ats[k], &ats[k]
				k++
				rs[ref.i].Fresh, rs[ref.i].Value = true, msg
			}
			if err := rows.Err(); err != nil {
				var pgErr *pgconn.PgError
				if errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "inbox_chat_id_seq_key" {
					return fmt.Errorf("%w: %w: (chat, seq) already stored under another message id: %s", inbox.ErrMalformed, ErrSeqConflict, pgErr.Detail)
				}
				return fmt.Errorf("insert inbox batch: %w", err)
			}
			return nil
		})
	}
	// After the insert, so it sees the new rows; for duplicates too (a
	// message published again by the re-drive gets its receipt).
	queueReceipts(b, bts, chat.MaxReceiptChats)
}

// queueReceipts queues the receipt emits of bts, which share one
// transaction: one receipt for as many batches in a row (those that
// stored messages or seq floors) as fit in limit chat entries (one per
// message and per floor, so at most limit distinct chats:
// chat.MaxReceiptChats), in the outbox of the first one's partition.
// Receipts are cumulative per chat and apply in any order, so a chat's
// receipt need not travel in its own partition's lane; one receipt per
// transaction instead of one per partition saves, for each batch merged,
// an outbox row, its Redis entry and the other side's inbox delivery. Its
// trace context is that of the first traced message.
func queueReceipts(b *pgx.Batch, bts []*inboxBatch, limit int) {
	var chats []int64
	var first *inboxBatch
	traced := ""
	flush := func() {
		if first == nil {
			return
		}
		var headers *string
		if traced != "" {
			j := `{"` + traceparentHeader + `":"` + traced + `"}` // a traceparent is hex and '-': nothing to escape
			headers = &j
		}
		b.Queue(first.h.rq.emit, chats, first.h.service, headers)
		first.h.receipted.Store(true)
		chats, first, traced = nil, nil, ""
	}
	for _, bt := range bts {
		n := len(bt.chats) + len(bt.fChats)
		if n == 0 {
			continue
		}
		if first != nil && len(chats)+n > limit {
			flush()
		}
		if first == nil {
			first = bt
		}
		chats = append(append(chats, bt.chats...), bt.fChats...)
		traced = cmp.Or(traced, bt.traced)
	}
	flush()
}

// traceparentHeader is the event header of the W3C trace context
// (telemetry.Traceparent; the receiver keeps only that one).
const traceparentHeader = "traceparent"

// maxTraceparentBytes bounds a traceparent kept in the inbox (version 00
// is 55 bytes).
const maxTraceparentBytes = 64

// validTraceparent reports whether tp looks like a W3C traceparent: 1 to
// maxTraceparentBytes lower-case hex digits and '-'. The header is outside
// input; anything else is not kept (a tracer would refuse it anyway), and
// what is kept can be spliced into the receipt's JSON as it is.
func validTraceparent(tp string) bool {
	if tp == "" || len(tp) > maxTraceparentBytes {
		return false
	}
	for i := 0; i < len(tp); i++ {
		if c := tp[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || c == '-') {
			return false
		}
	}
	return true
}

var (
	_ inbox.Handler         = (*InboxHandler)(nil)
	_ inbox.BatchHandler    = (*InboxHandler)(nil)
	_ inbox.PipelineHandler = (*InboxHandler)(nil)
)
