package chat

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Delivery receipts.
//
// When a service's inbox transaction stores messages, the same transaction
// enqueues in that service's own outbox one receipt for the batch, with one
// entry per chat of the batch: "I have stored every message of yours in
// this chat up to seq N", N being the highest seq below which nothing is
// missing (the highest inbox row of the chat that was not stored behind a
// gap: see migration 007). One receipt per batch rather than per chat: under load a batch
// spans many chats, and the receipts' round trip (outbox row, relay, Redis,
// the other side's inbox) is paid once per batch. The receipt travels back exactly as
// a message does — relay, Redis stream, the other side's inbox consumer —
// and the sender applies it in its inbox transaction: a row (chat, N, the
// receiver's commit time) goes into <service>.receipts when N is above the
// chat's newest (migration 007: insert-only; a message's delivered_at is
// the time of the first row at or above its seq), and a NOTIFY on
// ReceiptChannel tells the gateways, which push a receipt frame to the
// room. Receipts are cumulative, so a lost or repeated one is harmless: the
// next one covers it, and applying one twice changes nothing. A receipt is
// also sent for a batch made only of duplicates, so a message the re-drive
// published again is marked delivered even when its first receipt was lost.

// EventReceipt is the outbox event name of a delivery receipt.
const EventReceipt = "receipt"

// Receipt is a delivery receipt as the event payload carries it (JSON,
// snake_case).
//
//   - ID: a UUID, the job's idempotency key (each receipt has its own).
//   - Chats: one entry per chat, 1..MaxReceiptChats of them: every
//     message of the receipt's addressee in chat ChatID with seq
//     1..UptoSeq is stored by the sender of the receipt (both > 0).
//   - ReceivedAt: the receiver's inbox commit time (RFC 3339, µs); the
//     addressee's messages get it as delivered_at.
//   - From: the service that sends the receipt (the receiver of the
//     messages).
type Receipt struct {
	ID         string        `json:"id"`
	Chats      []ReceiptChat `json:"chats"`
	ReceivedAt time.Time     `json:"received_at"`
	From       string        `json:"from"`
}

// ReceiptChat is one chat's entry of a Receipt.
type ReceiptChat struct {
	ChatID  int64 `json:"chat_id"`
	UptoSeq int64 `json:"upto_seq"`
}

// MaxReceiptChats bounds the chats of one receipt (an inbox batch holds at
// most inbox.DefaultBatchSize deliveries unless configured otherwise).
const MaxReceiptChats = 10000

// DecodeReceipt decodes and checks a receipt payload: id a UUID, 1 to
// MaxReceiptChats chats each with chat_id and upto_seq > 0, received_at an
// RFC 3339 time, from a known service. Unknown fields are ignored. Every
// error wraps ErrMalformedEvent.
func DecodeReceipt(data []byte) (Receipt, error) {
	var r Receipt
	var raw struct {
		ID         string        `json:"id"`
		Chats      []ReceiptChat `json:"chats"`
		ReceivedAt string        `json:"received_at"`
		From       string        `json:"from"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return r, fmt.Errorf("%w: receipt: %v", ErrMalformedEvent, err)
	}
	if _, err := uuid.Parse(raw.ID); err != nil || len(raw.ID) != 36 {
		return r, fmt.Errorf("%w: receipt id %q is not a UUID", ErrMalformedEvent, raw.ID)
	}
	if len(raw.Chats) == 0 || len(raw.Chats) > MaxReceiptChats {
		return r, fmt.Errorf("%w: receipt has %d chats, want 1..%d", ErrMalformedEvent, len(raw.Chats), MaxReceiptChats)
	}
	for _, c := range raw.Chats {
		if c.ChatID <= 0 || c.UptoSeq <= 0 {
			return r, fmt.Errorf("%w: receipt chat_id and upto_seq must be positive", ErrMalformedEvent)
		}
	}
	t, err := time.Parse(time.RFC3339Nano, raw.ReceivedAt)
	if err != nil {
		return r, fmt.Errorf("%w: receipt received_at: %v", ErrMalformedEvent, err)
	}
	if Peer(raw.From) == "" {
		return r, fmt.Errorf("%w: receipt from %q is not a known service", ErrMalformedEvent, raw.From)
	}
	return Receipt{ID: strings.ToLower(raw.ID), Chats: raw.Chats, ReceivedAt: t, From: raw.From}, nil
}

// ReceiptFrame is the WebSocket frame that tells a room's clients that the
// messages of From in chat ChatID up to seq UptoSeq are delivered:
//
//	{"type":"receipt","chat_id":1,"from":"consumers","upto_seq":7,"delivered_at":"…"}
//
// From is the service whose messages were delivered (the page's own side on
// the sender's page). It has no "id" and no "seq", so a client that reads
// only Message frames skips it. Sent live when a receipt is applied, and
// once when a socket opens (the room's current watermark), so a client that
// reconnects learns of receipts it missed.
type ReceiptFrame struct {
	Type        string    `json:"type"` // always "receipt"
	ChatID      int64     `json:"chat_id"`
	From        string    `json:"from"`
	UptoSeq     int64     `json:"upto_seq"`
	DeliveredAt time.Time `json:"delivered_at"`
}

// MarshalJSON writes the frame with the time in RFC 3339, µs, UTC.
func (f ReceiptFrame) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Type        string `json:"type"`
		ChatID      int64  `json:"chat_id"`
		From        string `json:"from"`
		UptoSeq     int64  `json:"upto_seq"`
		DeliveredAt string `json:"delivered_at"`
	}{"receipt", f.ChatID, f.From, f.UptoSeq, formatTime(f.DeliveredAt)})
}

// ReceiptChannel is the NOTIFY channel of receipts applied to service's
// messages; the payload is "chat_id:upto_seq:unix_µs" items joined by ",".
func ReceiptChannel(service string) string { return service + "_receipts" }

// parseReceiptNote parses a ReceiptChannel payload; malformed items are
// skipped.
func parseReceiptNote(payload string) []receiptNote {
	var out []receiptNote
	for _, item := range strings.Split(payload, ",") {
		var n receiptNote
		var us int64
		if _, err := fmt.Sscanf(item, "%d:%d:%d", &n.chatID, &n.upto, &us); err != nil {
			continue
		}
		n.at = time.UnixMicro(us)
		out = append(out, n)
	}
	return out
}

// receiptNote is one applied receipt as the gateway handles it.
type receiptNote struct {
	chatID, upto int64
	at           time.Time
}

// receiptQueries are the receipts' statements for one service.
type receiptQueries struct {
	// emit computes the watermarks of the chats $1 of an inbox batch (it
	// runs after the batch's insert, in the same transaction, so it sees
	// the new rows) and enqueues one receipt listing every chat whose
	// watermark is above 0 in the service's own outbox (migration 007).
	//
	// A chat's stored watermark: its top row (one backward index descent)
	// when that is not held, and then it is the watermark; otherwise the highest of the rows below it that are not held
	// (a backward scan over the rows held behind the open gap) and of the
	// chat's newest gap fill. Not one filtered backward scan: a plan cached
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
	// batch's insert itself (issue 9's cost). $2 is the service (the
	// receipt's "from").
	emit string
	// apply records the receipts ($1 chats, $2 upto seqs, $3 times;
	// several per chat allowed: the highest seq and latest time win) in
	// the service's receipts table, NOTIFYs $4 with the chats that
	// advanced, and returns each chat's upto and time. A chat advances
	// when the receipt's upto is above the chat's newest row (a backward
	// scan of the primary key meets it first); the insert is one row per
	// chat, whatever the number of messages covered. Nothing is updated:
	// the UPDATE of delivered_at on every covered message that this
	// replaced made each message a second row version and a set of index
	// entries, and its cost grew while a session held back the xmin
	// horizon (migration 007; issues 9 and 17). Inserts go in chat_id
	// order, so two inbox consumers cannot deadlock on them; ON CONFLICT:
	// another consumer inserted the same row first.
	apply string
	// watermark reads a chat's highest delivered seq and its time.
	watermark string
}

func newReceiptQueries(service string) receiptQueries {
	s := pgx.Identifier{service}.Sanitize()
	return receiptQueries{
		emit: `WITH c AS (SELECT DISTINCT unnest($1::bigint[]) AS chat_id),
			top AS MATERIALIZED (SELECT c.chat_id, t.seq AS top, t.held FROM c
				LEFT JOIN LATERAL (SELECT i.seq, i.held FROM ` + s + `.inbox i WHERE i.chat_id = c.chat_id
					ORDER BY i.chat_id DESC, i.seq DESC LIMIT 1) t ON true),
			cur AS MATERIALIZED (SELECT top.chat_id, top.held, CASE WHEN top.top IS NULL THEN 0 WHEN NOT top.held THEN top.top
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
			INSERT INTO ` + s + `.outbox (event, idempotency_key, payload)
			SELECT '` + EventReceipt + `', g.id::text, jsonb_build_object('id', g.id, 'chats', r.chats,
				'received_at', now(), 'from', $2::text)
			FROM r, g`,
		apply: `WITH r AS (SELECT chat_id, max(upto) AS upto, max(at) AS at
				FROM unnest($1::bigint[], $2::bigint[], $3::timestamptz[]) AS u(chat_id, upto, at) GROUP BY chat_id),
			ins AS (INSERT INTO ` + s + `.receipts (chat_id, upto_seq, delivered_at)
				SELECT r.chat_id, r.upto, r.at FROM r
				WHERE r.upto > COALESCE((SELECT d.upto_seq FROM ` + s + `.receipts d
					WHERE d.chat_id = r.chat_id ORDER BY d.upto_seq DESC LIMIT 1), 0)
				ORDER BY r.chat_id
				ON CONFLICT DO NOTHING
				RETURNING chat_id),
			note AS (SELECT pg_notify($4, string_agg(r.chat_id || ':' || r.upto || ':' ||
					(extract(epoch FROM r.at) * 1000000)::bigint, ','))
				FROM r JOIN ins USING (chat_id) HAVING count(*) > 0)
			SELECT r.chat_id, r.upto, r.at, (SELECT count(*) FROM note) FROM r`,
		watermark: `SELECT upto_seq, delivered_at FROM ` + s + `.receipts
			WHERE chat_id = $1 ORDER BY upto_seq DESC LIMIT 1`,
	}
}
