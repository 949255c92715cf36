package gateway

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/chat"
)

// Edits, deletes and read receipts reach the rooms as frames of their own
// (chat.ChangeFrame, chat.ReadFrame): the gateway hears of them on
// chat.ChangeChannel and chat.ReadChannel (NOTIFY in the transaction that
// wrote them, on either side), reads the changed messages back in one
// statement per push, and hands every subscriber of the room the frame.
// They are not cursor-ordered: a client that has not seen the message yet
// gets it, in its latest version, when its cursor reaches it (the room
// read returns rows as they are now).

// changeRef names a changed message: its origin and id.
type changeRef struct{ from, id string }

// changesSQL reads changed messages by id: $1 this service's, $2 received.
func changesSQL(service string) string {
	s := pgx.Identifier{service}.Sanitize()
	return `SELECT m.id::text, m.chat_id, m.seq, m.body, m.created_at, $3::text, coalesce(m.author, ''), m.version, m.edited_at, m.deleted
		FROM ` + s + `.messages m WHERE m.id = ANY($1::uuid[])
		UNION ALL
		SELECT i.message_id::text, i.chat_id, i.seq, i.body, i.sent_at, i.sender, coalesce(i.author, ''), i.version, i.edited_at, i.deleted
		FROM ` + s + `.inbox i WHERE i.message_id = ANY($2::uuid[])`
}

// onChangeNotify queues the changes a ChangeChannel notification names
// ("chat_id:origin:message_id") for rooms with subscribers. Called from
// the notifier's goroutine.
func (g *Gateway) onChangeNotify(payload string, _ uint32) {
	for _, item := range strings.Split(payload, ",") {
		parts := strings.SplitN(item, ":", 3)
		if len(parts) != 3 {
			continue
		}
		id, err := strconv.ParseInt(parts[0], 10, 64)
		if err != nil {
			continue
		}
		g.Changed(id, parts[1], parts[2])
	}
}

// onReadNotify queues the read receipts of a ReadChannel notification.
func (g *Gateway) onReadNotify(payload string, _ uint32) {
	for _, r := range parseReceiptNote(payload) {
		g.Read(r.chatID, r.upto, r.at)
	}
}

// Changed tells the gateway that message id of origin from in chat chatID
// was edited or deleted (committed). A room without subscribers drops it.
// Never blocks; safe for concurrent use.
func (g *Gateway) Changed(chatID int64, from, id string) {
	g.mu.Lock()
	if _, ok := g.rooms[chatID]; ok && g.running {
		if g.changes == nil {
			g.changes = map[changeRef]int64{}
		}
		g.changes[changeRef{from, id}] = chatID
	}
	g.mu.Unlock()
	g.signal()
}

// Read tells the room chatID's subscribers that this service's messages up
// to seq upto were read at at (a chat.ReadFrame); as Receipt.
func (g *Gateway) Read(chatID, upto int64, at time.Time) { g.note(&g.reads, chatID, upto, at) }

// pushChanges hands the pending change and read frames to their rooms'
// subscribers (a full buffer evicts, as for messages). A failed read puts
// the changes back for the next push. Called by the gateway goroutine only.
func (g *Gateway) pushChanges(ctx context.Context) {
	g.mu.Lock()
	changes, reads := g.changes, g.reads
	g.changes, g.reads = nil, nil
	subsOf := func(id int64) []*Subscription {
		var out []*Subscription
		for s := range g.rooms[id] {
			out = append(out, s)
		}
		return out
	}
	readSubs := map[int64][]*Subscription{}
	for id := range reads {
		readSubs[id] = subsOf(id)
	}
	changeSubs := map[int64][]*Subscription{}
	for _, id := range changes {
		changeSubs[id] = subsOf(id)
	}
	g.mu.Unlock()
	for id, r := range reads {
		b, _ := json.Marshal(chat.ReadFrame{ChatID: id, From: g.service, UptoSeq: r.upto, ReadAt: r.at})
		g.fanOut(readSubs[id], b)
	}
	if len(changes) == 0 {
		return
	}
	var own, recv []string
	for ref := range changes {
		if ref.from == g.service {
			own = append(own, ref.id)
		} else {
			recv = append(recv, ref.id)
		}
	}
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rows, err := g.pool.Query(qctx, g.changesQuery, own, recv, g.service)
	var ms []chat.Message
	if err == nil {
		ms, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (chat.Message, error) {
			var m chat.Message
			var version int32
			err := r.Scan(&m.ID, &m.ChatID, &m.Seq, &m.Body, &m.SentAt, &m.From, &m.Author, &version, &m.EditedAt, &m.Deleted)
			m.Version = int64(version)
			return m, err
		})
	}
	if err != nil {
		if ctx.Err() == nil {
			g.log.Warn("read changed messages", "err", err)
			g.mu.Lock()
			for ref, id := range changes {
				if g.changes == nil {
					g.changes = map[changeRef]int64{}
				}
				g.changes[ref] = id
			}
			g.mu.Unlock()
		}
		return
	}
	for _, m := range ms {
		id, ok := changes[changeRef{m.From, m.ID}]
		if !ok || id != m.ChatID {
			continue
		}
		b, err := json.Marshal(chat.ChangeFrame{Message: m})
		if err != nil {
			continue
		}
		g.fanOut(changeSubs[id], b)
	}
}

// fanOut queues frame b to each subscriber, evicting one whose buffer is
// full.
func (g *Gateway) fanOut(subs []*Subscription, b []byte) {
	for _, s := range subs {
		s.offer(b)
	}
}
