package receive

import (
	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/inbox"
)

// decodeFloor checks a seq.floor delivery (chat.EventSeqFloor) without
// touching the database: a Receipt-shaped payload from the other service
// whose id is the job id. Errors wrap inbox.ErrMalformed.
func (h *InboxHandler) decodeFloor(d inbox.Delivery) (chat.Receipt, error) {
	r, err := chat.DecodeReceipt(d.Payload)
	return r, h.checkDecoded(d, "seq floor", r.ID, r.From, err)
}

// queueFloors queues the statement that applies seq floors: for each chat
// $1, the sender will never send a seq up to $2 that it has not sent, so
// the chat's inbox floor (its newest gap fill, migration 008) goes up to
// it. Messages the sender did send up to there and the inbox has not
// stored yet (still in the stream) are then taken for duplicates: the
// sender lost them with the commits its database lost, and reports them
// (seq_lost). Rows held above the floor are then counted by the receipts'
// emit, which runs next for these chats. Runs under the chats' inbox
// locks, taken just before.
func (h *InboxHandler) queueFloors(b *pgx.Batch, chats, upto []int64) {
	s := pgx.Identifier{h.service}.Sanitize()
	b.Queue(`INSERT INTO `+s+`.inbox_gap_fills (chat_id, upto)
		SELECT f.chat_id, max(f.upto) FROM unnest($1::bigint[], $2::bigint[]) AS f(chat_id, upto)
		GROUP BY f.chat_id
		HAVING max(f.upto) > coalesce((SELECT g.upto FROM `+s+`.inbox_gap_fills g
			WHERE g.chat_id = f.chat_id ORDER BY g.upto DESC LIMIT 1), 0)
		ORDER BY f.chat_id
		ON CONFLICT DO NOTHING`, chats, upto)
}
