package receive

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
}

// ForPartition returns a copy of h for the stream of partition p
// (chat.PartitionQueue): the receipts of its batches are enqueued in the
// outbox of the same partition (chat.OutboxTable(service, p)), so that
// they travel back in the lane of their chats. ForPartition(0) is h's
// behaviour. The copy shares nothing mutable with h.
func (h *InboxHandler) ForPartition(p int) *InboxHandler {
	c := *h
	c.rq = newReceiptQueries(h.service, p)
	return &c
}

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
		service: service,
		keys:    keys,
		rq:      newReceiptQueries(service, 0),
		cq:      newChangeQueries(service),
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
	ids := make([]pgtype.UUID, 0, n)
	bodies, senders, authors := make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
	tps, refs := make([]string, 0, n), make([]string, 0, n)
	chats, seqs, sentAts := make([]int64, 0, n), make([]int64, 0, n), make([]time.Time, 0, n)
	var repeats []pgtype.UUID
	traced := "" // the first traceparent of the batch's messages: the receipt's
	var rChats, rUpto []int64
	var rAts []time.Time
	var fChats, fUpto []int64        // seq floors (floor.go)
	first := make(map[string]int, n) // message id → index of its first delivery in ds
	msgs := make([]chat.Message, n)
	// Edits, deletes and read receipts (changes.go), queued after the
	// messages' statements so that a change finds its message of the same
	// batch.
	var changes changeBatch
	defer changes.queue(b)
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
				fChats, fUpto = append(fChats, c.ChatID), append(fUpto, c.UptoSeq)
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
				rChats, rUpto, rAts = append(rChats, c.ChatID), append(rUpto, c.UptoSeq), append(rAts, r.ReceivedAt)
			}
			rs[i].Fresh, rs[i].Value = true, r
			continue
		}
		if isChangeEvent(d.Name) {
			changes.add(h, d, i, rs)
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
		if _, seen := first[m.ID]; seen {
			repeats = append(repeats, pgtype.UUID{Bytes: id, Valid: true}) // a duplicate inside the batch
			continue
		}
		first[m.ID] = i
		msgs[i] = m
		ids, chats, seqs = append(ids, pgtype.UUID{Bytes: id, Valid: true}), append(chats, m.ChatID), append(seqs, m.Seq)
		bodies, senders, sentAts = append(bodies, m.Body), append(senders, m.From), append(sentAts, m.SentAt)
		authors = append(authors, m.Author)
		// The message's trace context (migration 011): kept in its row for
		// the gateway's push, and sent back on the batch's receipt (one
		// receipt per batch, so it joins the trace of its first traced
		// message).
		tp := d.Headers[traceparentHeader]
		if !validTraceparent(tp) {
			tp = ""
		}
		tps, refs = append(tps, tp), append(refs, d.Ref)
		if traced == "" {
			traced = tp
		}
		msgs[i].TraceParent = tp
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
	if len(ids) == 0 && len(fChats) == 0 {
		return nil
	}
	// One lock set for the floors' chats and the messages' together, in
	// ascending order: two sets taken one after the other could deadlock
	// with another consumer's.
	locks := append(slices.Clone(chats), fChats...)
	slices.Sort(locks)
	b.Queue(h.lockChats, slices.Compact(locks))
	if len(fChats) > 0 {
		h.queueFloors(b, fChats, fUpto)
		if len(ids) == 0 {
			b.Queue(h.rq.emit, fChats, h.service, nil)
			return nil
		}
	}
	b.Queue(h.insertBatch, ids, chats, seqs, bodies, senders, sentAts, repeats, authors, tps, refs).Query(func(rows pgx.Rows) error {
		// The ids are read as the driver's bytes (valid until the next
		// row) and only looked up: no string per row. The received times
		// share one array: no allocation per row either.
		var id, taken pgtype.DriverBytes
		ats := make([]time.Time, len(ds))
		for rows.Next() {
			var at time.Time
			if err := rows.Scan(&id, &at, &taken); err != nil {
				return fmt.Errorf("insert inbox batch: %w", err)
			}
			i, ok := first[string(id)]
			if !ok {
				continue
			}
			m := msgs[i]
			if len(taken) > 0 {
				rs[i].Err = fmt.Errorf("%w: %w: chat %d seq %d is already stored under message %s, not %s",
					inbox.ErrMalformed, ErrSeqConflict, m.ChatID, m.Seq, taken, m.ID)
				continue
			}
			ats[i] = at
			m.ReceivedAt, m.DeliveredAt = &ats[i], &ats[i]
			rs[i].Fresh, rs[i].Value = true, m
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
	// After the insert, so it sees the new rows; for duplicates too (a
	// message published again by the re-drive gets its receipt).
	var receiptHeaders *string
	if traced != "" {
		j := `{"` + traceparentHeader + `":"` + traced + `"}` // a traceparent is hex and '-': nothing to escape
		receiptHeaders = &j
	}
	b.Queue(h.rq.emit, append(slices.Clip(chats), fChats...), h.service, receiptHeaders)
	return nil
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
