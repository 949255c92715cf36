package chat

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
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
// the other side's inbox) is paid once per batch; the batches of several
// partitions that share an inbox transaction send one receipt for all
// (up to MaxReceiptChats chats), through the first batch's partition. The receipt travels back exactly as
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
	if !isUUID(raw.ID) {
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

// EventSeqFloor is the outbox event name of a seq floor: the sender's
// word that, in each chat listed, it will never send a message with a seq
// up to UptoSeq that it has not sent already. Its payload has a Receipt's
// shape (DecodeReceipt): ReceivedAt is when the sender recorded the floor,
// From the sender. A sender emits one when its database lost commits (a
// failover to an asynchronous replica, a restore) after their messages had
// been published: it then skips the seqs it can no longer account for
// (chat/store.Fence), and the receiver, which may never get them, records
// the floor so its watermark and receipts go past them instead of holding
// the chat's next messages behind a gap nothing will fill.
const EventSeqFloor = "seq.floor"

// isUUID reports whether s is a UUID in its canonical 36-character form,
// the only form event ids, job ids and message ids take.
func isUUID(s string) bool {
	_, err := uuid.Parse(s)
	return err == nil && len(s) == 36
}
