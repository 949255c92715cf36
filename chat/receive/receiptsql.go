package receive

import (
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/chat"
)

// receiptQueries are the receipts' statements for one service.
type receiptQueries struct {
	// emit computes the watermarks of the chats $1 of an inbox batch (it
	// runs after the batch's insert, in the same transaction, so it sees
	// the new rows) and enqueues one receipt listing every chat whose
	// watermark is above 0 in the service's own outbox (migration 007).
	//
	// A chat's stored watermark: its top row (one backward index descent)
	// when that is not held, and then it is the watermark; otherwise (held,
	// or no row) the highest of the rows below it that are not held (a
	// backward scan over the rows held behind the open gap) and of the
	// chat's newest gap fill, its floor: every seq up to it has been
	// stored, even if rows were deleted since (migration 008), so a chat
	// whose rows were all deleted keeps its watermark. (A top below the
	// floor, after its newest rows were deleted, gives a receipt below one
	// already sent: harmless, and the next message is above the floor.) Not one filtered backward scan: a plan cached
	// while the inbox was empty read the whole chat and sorted it, 30 ms
	// per batch. The watermark is the stored one plus the run of
	// consecutive seqs right above it: numbering the rows above it in seq
	// order, a row is in the run exactly when seq = stored + its row
	// number (after a gap, seq stays ahead of it). Rows above the stored
	// watermark are held behind a gap; when the run reaches them the gap
	// is filled, and (chat, watermark) goes into inbox_gap_fills, the one
	// write here besides the receipt.
	//
	// In steady state that is one index descent per chat and nothing
	// written but the receipt: the inbox_watermarks row this used to
	// insert per chat and batch, and its pruning, cost more than the
	// batch's insert itself. $2 is the service (the
	// receipt's "from"), $3 the receipt's event headers (a JSON object,
	// or NULL for none: the trace context of a message of the batch).
	emit string
	// apply records the receipts ($1 chats, $2 upto seqs, $3 times;
	// several per chat allowed: the highest seq and latest time win) in
	// the service's receipts table and returns each chat's upto and time
	// (the gateways hear of them from a Waker, after the commit). A chat advances
	// when the receipt's upto is above the chat's newest row (a backward
	// scan of the primary key meets it first); the insert is one row per
	// chat, whatever the number of messages covered. Nothing is updated:
	// the UPDATE of delivered_at on every covered message that this
	// replaced made each message a second row version and a set of index
	// entries, and its cost grew while a session held back the xmin
	// horizon (migration 007). A receipt that advances a chat above its
	// newest message (the other side holds seqs this side no longer has,
	// e.g. after a restore) also records a seq floor there, so the next
	// send numbers above it (migration 008; one backward index step per
	// chat advanced, none per send). Inserts go in chat_id
	// order, so two inbox consumers cannot deadlock on them; ON CONFLICT:
	// another consumer inserted the same row first.
	apply string
}

// newReceiptQueries builds service's receipt statements; the receipt is
// enqueued in the outbox of partition p (chat.OutboxTable): an inbox batch
// holds the chats of one partition (it comes from that partition's
// stream), and its receipt goes back through the same partition, except
// that the batches of a shared inbox transaction send one receipt through
// the first one's (queueReceipts).
func newReceiptQueries(service string, p int) receiptQueries {
	s := pgx.Identifier{service}.Sanitize()
	ob := pgx.Identifier(strings.Split(chat.OutboxTable(service, p), ".")).Sanitize()
	return receiptQueries{
		emit: `WITH c AS (SELECT DISTINCT unnest($1::bigint[]) AS chat_id),
			top AS MATERIALIZED (SELECT c.chat_id, t.seq AS top, t.held FROM c
				LEFT JOIN LATERAL (SELECT i.seq, i.held FROM ` + s + `.inbox i WHERE i.chat_id = c.chat_id
					ORDER BY i.chat_id DESC, i.seq DESC LIMIT 1) t ON true),
			cur AS MATERIALIZED (SELECT top.chat_id, top.held, CASE WHEN top.top IS NOT NULL AND NOT top.held THEN top.top
					ELSE greatest(
						COALESCE((SELECT i.seq FROM ` + s + `.inbox i
							WHERE i.chat_id = top.chat_id AND i.seq < top.top AND NOT i.held ORDER BY i.seq DESC LIMIT 1), 0),
						COALESCE((SELECT g.upto FROM ` + s + `.inbox_gap_fills g
							WHERE g.chat_id = top.chat_id ORDER BY g.upto DESC LIMIT 1), 0)) END AS old
				FROM top),
			calc AS MATERIALIZED (SELECT cur.chat_id, cur.old, CASE WHEN cur.held IS NOT TRUE THEN cur.old ELSE cur.old + (
				SELECT count(*) FROM (
					SELECT i.seq, row_number() OVER (ORDER BY i.seq) AS rn
					FROM ` + s + `.inbox i WHERE i.chat_id = cur.chat_id AND i.seq > cur.old
				) run WHERE run.seq = cur.old + run.rn
			) END AS upto FROM cur),
			up AS (INSERT INTO ` + s + `.inbox_gap_fills (chat_id, upto)
				SELECT chat_id, upto FROM calc WHERE upto > old ORDER BY chat_id
				ON CONFLICT DO NOTHING),
			r AS (SELECT jsonb_agg(jsonb_build_object('chat_id', chat_id, 'upto_seq', upto) ORDER BY chat_id) AS chats
				FROM calc WHERE upto > 0 HAVING count(*) > 0),
			g AS (SELECT gen_random_uuid() AS id)
			INSERT INTO ` + ob + ` (event, idempotency_key, payload, headers)
			SELECT '` + chat.EventReceipt + `', g.id::text, jsonb_build_object('id', g.id, 'chats', r.chats,
				'received_at', now(), 'from', $2::text), $3::text::jsonb
			FROM r, g`,
		apply: watermarkCTEs(s+".receipts", "delivered_at", "chat_id") + `,
			fl AS (INSERT INTO ` + s + `.seq_floors (chat_id, seq)
				SELECT r.chat_id, r.upto FROM r JOIN ins USING (chat_id)
				WHERE r.upto > coalesce((SELECT max(m.seq) FROM ` + s + `.messages m WHERE m.chat_id = r.chat_id), 0)
				ORDER BY r.chat_id
				ON CONFLICT DO NOTHING)
			SELECT r.chat_id, r.upto, r.at FROM r`,
	}
}

// watermarkCTEs is the start of a statement that records per-chat
// watermarks insert-only ($1 chats, $2 seqs, $3 times; table is a
// sanitized "<schema>.<table>" with chat_id, upto_seq and the time column
// atCol): r is the batch's highest seq and time per chat, and ins inserts
// into table one row per chat whose seq is above the table's newest,
// RETURNING returning. The receipts' apply and the read receipts' reads
// (changeQueries) continue it with their own CTEs.
func watermarkCTEs(table, atCol, returning string) string {
	return `WITH r AS (SELECT chat_id, max(upto) AS upto, max(at) AS at
				FROM unnest($1::bigint[], $2::bigint[], $3::timestamptz[]) AS u(chat_id, upto, at) GROUP BY chat_id),
			ins AS (INSERT INTO ` + table + ` (chat_id, upto_seq, ` + atCol + `)
				SELECT r.chat_id, r.upto, r.at FROM r
				WHERE r.upto > COALESCE((SELECT d.upto_seq FROM ` + table + ` d
					WHERE d.chat_id = r.chat_id ORDER BY d.upto_seq DESC LIMIT 1), 0)
				ORDER BY r.chat_id
				ON CONFLICT DO NOTHING
				RETURNING ` + returning + `)`
}
