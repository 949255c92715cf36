package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/outbox"
)

// featureQueries are the statements of the latest-first history, the chat
// list, edits, deletes and read marks (migration 009), none of them on the
// send path.
type featureQueries struct {
	latestSent, latestRecv, chatsAll, chatsListed, lockOwn, change, ownByID, markRead, unread, readWatermark string
}

// ownCols are the columns of one of this service's messages m, with the
// delivered_at and read_at the receipts and read receipts give it (a probe
// each, only for messages the chat's newest one covers); w must hold the
// chat's newest receipt (upto) and read receipt (rupto).
func ownCols(s string) string {
	return `m.id::text, m.chat_id, m.seq, m.body, m.created_at, coalesce(m.author, ''),
		CASE WHEN m.seq <= w.upto THEN (SELECT r.delivered_at FROM ` + s + `.receipts r
			WHERE r.chat_id = m.chat_id AND r.upto_seq >= m.seq ORDER BY r.upto_seq LIMIT 1) END,
		m.version, m.edited_at, m.deleted,
		CASE WHEN m.seq <= w.rupto THEN (SELECT x.read_at FROM ` + s + `.reads x
			WHERE x.chat_id = m.chat_id AND x.upto_seq >= m.seq ORDER BY x.upto_seq LIMIT 1) END`
}

// watermarksOf is the FROM item w of ownCols for chat expression c.
func watermarksOf(s, c string) string {
	return `(SELECT coalesce((SELECT upto_seq FROM ` + s + `.receipts WHERE chat_id = ` + c + `
			ORDER BY upto_seq DESC LIMIT 1), 0) AS upto,
		coalesce((SELECT upto_seq FROM ` + s + `.reads WHERE chat_id = ` + c + `
			ORDER BY upto_seq DESC LIMIT 1), 0) AS rupto) w`
}

// inboxCols are the columns of a received message i.
const inboxCols = `i.message_id::text, i.chat_id, i.seq, i.body, i.sent_at, i.received_at, i.sender, coalesce(i.author, ''),
	i.version, i.edited_at, i.deleted`

func newFeatureQueries(service string) featureQueries {
	s := pgx.Identifier{service}.Sanitize()
	// The chat list: per chat its newest message of either origin (one
	// backward step of each (chat_id, seq) index) and the reader's unread
	// count (an index range of the inbox above the reader's mark), newest
	// chat first, from the cursor ($3 time, $4 chat id) on.
	list := func(ids string) string {
		return `WITH RECURSIVE ` + ids + `
			SELECT ids.chat_id, t.received, t.id, t.seq, t.body, t.at, t.sender, t.author, t.version, t.edited_at, t.deleted,
				(SELECT count(*) FROM ` + s + `.inbox u WHERE u.chat_id = ids.chat_id AND u.seq > coalesce((SELECT rm.upto_seq
					FROM ` + s + `.read_marks rm WHERE rm.chat_id = ids.chat_id AND rm.reader = $2), 0) AND NOT u.deleted)
			FROM ids CROSS JOIN LATERAL (SELECT * FROM (
				(SELECT false AS received, m.id::text AS id, m.seq, m.body, m.created_at AS at, $5::text AS sender,
					coalesce(m.author, '') AS author, m.version, m.edited_at, m.deleted
				FROM ` + s + `.messages m WHERE m.chat_id = ids.chat_id ORDER BY m.seq DESC LIMIT 1)
				UNION ALL
				(SELECT true, i.message_id::text, i.seq, i.body, i.sent_at, i.sender, coalesce(i.author, ''), i.version, i.edited_at, i.deleted
				FROM ` + s + `.inbox i WHERE i.chat_id = ids.chat_id ORDER BY i.seq DESC LIMIT 1)) x
				ORDER BY x.at DESC LIMIT 1) t
			WHERE (t.at, ids.chat_id) < ($3::timestamptz, $4::bigint)
			ORDER BY t.at DESC, ids.chat_id DESC LIMIT $1`
	}
	// skip scans of both (chat_id, seq) indexes: one descent per chat.
	skip := func(name, table string) string {
		return name + ` AS ((SELECT chat_id FROM ` + s + `.` + table + ` WHERE chat_id > 0 ORDER BY chat_id LIMIT 1)
				UNION ALL
				SELECT (SELECT t.chat_id FROM ` + s + `.` + table + ` t WHERE t.chat_id > c.chat_id ORDER BY t.chat_id LIMIT 1)
				FROM ` + name + ` c WHERE c.chat_id IS NOT NULL)`
	}
	return featureQueries{
		// latestSent, latestRecv: the newest $3 messages of each origin
		// below the cursor $2, newest first (a backward range of the
		// (chat_id, seq) index).
		latestSent: `SELECT ` + ownCols(s) + ` FROM ` + s + `.messages m, ` + watermarksOf(s, "$1") + `
			WHERE m.chat_id = $1 AND m.seq < $2 ORDER BY m.seq DESC LIMIT $3`,
		latestRecv: `SELECT ` + inboxCols + ` FROM ` + s + `.inbox i
			WHERE i.chat_id = $1 AND i.seq < $2 ORDER BY i.seq DESC LIMIT $3`,
		chatsAll: list(skip("cm", "messages") + `, ` + skip("ci", "inbox") + `,
			ids AS (SELECT chat_id FROM cm WHERE chat_id IS NOT NULL UNION SELECT chat_id FROM ci WHERE chat_id IS NOT NULL)`),
		chatsListed: list(`ids AS (SELECT DISTINCT unnest($6::bigint[]) AS chat_id)`),
		// lockOwn: the message to change, locked: its changes take turns,
		// so versions follow commit order.
		lockOwn: `SELECT coalesce(author, ''), deleted FROM ` + s + `.messages WHERE id = $1::uuid AND chat_id = $2 FOR UPDATE`,
		change: `UPDATE ` + s + `.messages SET body = $2, deleted = $3, version = version + 1, edited_at = now()
			WHERE id = $1::uuid RETURNING seq, version, edited_at`,
		ownByID: `SELECT ` + ownCols(s) + ` FROM ` + s + `.messages m, ` + watermarksOf(s, "$2") + `
			WHERE m.id = $1::uuid AND m.chat_id = $2`,
		// markRead moves the reader's mark forward to $3, at most to the
		// chat's newest received seq; it returns the mark when it moved.
		markRead: `INSERT INTO ` + s + `.read_marks AS rm (chat_id, reader, upto_seq, read_at)
			SELECT $1, $2, least($3::bigint, coalesce((SELECT i.seq FROM ` + s + `.inbox i WHERE i.chat_id = $1
				ORDER BY i.seq DESC LIMIT 1), 0)), now()
			ON CONFLICT (chat_id, reader) DO UPDATE SET upto_seq = EXCLUDED.upto_seq, read_at = EXCLUDED.read_at
				WHERE rm.upto_seq < EXCLUDED.upto_seq
			RETURNING upto_seq, read_at`,
		unread: `SELECT count(*) FROM ` + s + `.inbox u WHERE u.chat_id = $1 AND u.seq > coalesce((SELECT rm.upto_seq
			FROM ` + s + `.read_marks rm WHERE rm.chat_id = $1 AND rm.reader = $2), 0) AND NOT u.deleted`,
		// readWatermark: a chat's newest read receipt (one backward step).
		readWatermark: `SELECT upto_seq, read_at FROM ` + s + `.reads WHERE chat_id = $1 ORDER BY upto_seq DESC LIMIT 1`,
	}
}

// Latest returns the newest n (1..10000) messages of chat chatID below the
// cursors (seqs of this service's own messages and of the other's; 0 means
// no bound), both origins merged by sent_at, oldest first. It runs under
// the read timeout (errors wrap chat.ErrReadTimeout past it).
func (s *Store) Latest(ctx context.Context, chatID, beforeSent, beforeReceived int64, n int) (p chat.Page, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.readTimeout)
	defer cancel()
	defer func() {
		if err != nil && ctx.Err() == context.DeadlineExceeded {
			err = fmt.Errorf("%w: %w", chat.ErrReadTimeout, err)
		}
	}()
	bound := func(c int64) int64 {
		if c <= 0 {
			return math.MaxInt64
		}
		return c
	}
	rows, err := s.pool.Query(ctx, s.fq.latestSent, chatID, bound(beforeSent), n+1)
	if err != nil {
		return p, fmt.Errorf("latest: %w", err)
	}
	sent, err := pgx.CollectRows(rows, s.scanOwn)
	if err != nil {
		return p, fmt.Errorf("latest: %w", err)
	}
	rows, err = s.pool.Query(ctx, s.fq.latestRecv, chatID, bound(beforeReceived), n+1)
	if err != nil {
		return p, fmt.Errorf("latest inbox: %w", err)
	}
	recv, err := pgx.CollectRows(rows, scanInboxFull)
	if err != nil {
		return p, fmt.Errorf("latest inbox: %w", err)
	}
	reverse := func(ms []chat.Message) {
		for i, j := 0, len(ms)-1; i < j; i, j = i+1, j-1 {
			ms[i], ms[j] = ms[j], ms[i]
		}
	}
	if len(sent) > 0 {
		p.TopSent = sent[0].Seq
	}
	if len(recv) > 0 {
		p.TopReceived = recv[0].Seq
	}
	reverse(sent)
	reverse(recv)
	all := chat.MergeBySentAt(sent, recv)
	p.MoreBefore = len(all) > n
	if len(all) > n {
		all = all[len(all)-n:]
	}
	p.Messages = all
	p.BeforeSent, p.BeforeReceived = beforeSent, beforeReceived
	for i := len(all) - 1; i >= 0; i-- {
		if all[i].From == s.service {
			p.BeforeSent = all[i].Seq
		} else {
			p.BeforeReceived = all[i].Seq
		}
	}
	return p, nil
}

// scanOwn scans ownCols.
func (s *Store) scanOwn(r pgx.CollectableRow) (chat.Message, error) {
	m := chat.Message{From: s.service}
	var version int32
	err := r.Scan(&m.ID, &m.ChatID, &m.Seq, &m.Body, &m.SentAt, &m.Author, &m.DeliveredAt, &version, &m.EditedAt, &m.Deleted, &m.ReadAt)
	m.Version = int64(version)
	return m, err
}

// scanInboxFull scans inboxCols.
func scanInboxFull(r pgx.CollectableRow) (chat.Message, error) {
	var m chat.Message
	var recv time.Time
	var version int32
	err := r.Scan(&m.ID, &m.ChatID, &m.Seq, &m.Body, &m.SentAt, &recv, &m.From, &m.Author, &version, &m.EditedAt, &m.Deleted)
	m.ReceivedAt, m.DeliveredAt, m.Version = &recv, &recv, int64(version)
	return m, err
}

// Chats returns up to limit chats that hold messages, newest message first,
// after cursor: all of them when ids is nil, else those of ids. reader is
// the user whose unread counts are given. next is the cursor of the next
// page, zero when this was the last.
func (s *Store) Chats(ctx context.Context, ids []int64, reader string, limit int, after chat.ChatCursor) (list []chat.ChatSummary, next chat.ChatCursor, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.readTimeout)
	defer cancel()
	at, id := after.At, after.ChatID
	if after.ChatID == 0 {
		at, id = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), math.MaxInt64
	}
	q, args := s.fq.chatsAll, []any{limit + 1, reader, at, id, s.service}
	if ids != nil {
		q, args = s.fq.chatsListed, append(args, ids)
	}
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, next, fmt.Errorf("chat list: %w", err)
	}
	list, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (chat.ChatSummary, error) {
		var c chat.ChatSummary
		var received bool
		var version int32
		m := &c.LastMessage
		err := r.Scan(&c.ChatID, &received, &m.ID, &m.Seq, &m.Body, &m.SentAt, &m.From, &m.Author, &version, &m.EditedAt, &m.Deleted, &c.Unread)
		m.ChatID, m.Version = c.ChatID, int64(version)
		return c, err
	})
	if err != nil {
		return nil, next, fmt.Errorf("chat list: %w", err)
	}
	if len(list) > limit {
		list = list[:limit]
		last := list[limit-1]
		next = chat.ChatCursor{At: last.LastMessage.SentAt, ChatID: last.ChatID}
	}
	return list, next, nil
}

// Change edits (deleted false: body is the new text, already valid) or
// deletes (deleted true: body ignored) this service's message messageID in
// chat chatID as author ("" with auth off). In one transaction it locks the
// message, checks it, writes version n+1 and enqueues the
// message.edited/message.deleted event (chat.Change) in the outbox, and
// NOTIFYs chat.ChangeChannel; it returns the message as it now is.
// Errors: chat.ErrNoMessage, chat.ErrNotAuthor, chat.ErrDeletedMessage
// (all wrapped; nothing is written), or the database's.
func (s *Store) Change(ctx context.Context, chatID int64, messageID, body string, deleted bool, author string) (chat.Message, error) {
	if deleted {
		body = ""
	}
	var m chat.Message
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var owner string
		var gone bool
		err := tx.QueryRow(ctx, s.fq.lockOwn, messageID, chatID).Scan(&owner, &gone)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return chat.ErrNoMessage
		case err != nil:
			return err
		case owner != author:
			return chat.ErrNotAuthor
		case gone:
			return chat.ErrDeletedMessage
		}
		c := chat.Change{ID: uuid.Must(uuid.NewV7()).String(), MessageID: messageID, ChatID: chatID, Body: body, Deleted: deleted,
			From: s.service, Author: author}
		var version int32
		if err := tx.QueryRow(ctx, s.fq.change, messageID, body, deleted).Scan(&c.Seq, &version, &c.EditedAt); err != nil {
			return err
		}
		c.Version = int64(version)
		payload, err := json.Marshal(c)
		if err != nil {
			return err
		}
		if err := s.writerFor(chatID).Enqueue(ctx, tx, outbox.Event{ID: c.ID, Name: c.Event(), Payload: payload}); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, chat.ChangeChannel(s.service),
			strconv.FormatInt(chatID, 10)+":"+s.service+":"+messageID); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, s.fq.ownByID, messageID, chatID)
		if err != nil {
			return err
		}
		m, err = pgx.CollectExactlyOneRow(rows, s.scanOwn)
		return err
	})
	if err != nil {
		return chat.Message{}, fmt.Errorf("change message: %w", err)
	}
	s.eventCommitted(chatID)
	return m, nil
}

// MarkRead marks the other service's messages of chat chatID up to seq upto
// (at most the chat's newest received one) as read by reader. When that
// moves the reader's mark forward, the same transaction enqueues a
// message.read event (chat.ReadMark) for the other service. Marks only
// move forward: an older upto changes nothing and returns the current one.
func (s *Store) MarkRead(ctx context.Context, chatID int64, reader string, upto int64) (chat.ReadResult, error) {
	res := chat.ReadResult{ChatID: chatID}
	enqueued := false
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		enqueued = false
		err := tx.QueryRow(ctx, s.fq.markRead, chatID, reader, upto).Scan(&res.UptoSeq, &res.ReadAt)
		if errors.Is(err, pgx.ErrNoRows) {
			// Not forward: the current mark.
			err = tx.QueryRow(ctx, `SELECT upto_seq, read_at FROM `+pgx.Identifier{s.service}.Sanitize()+`.read_marks
				WHERE chat_id = $1 AND reader = $2`, chatID, reader).Scan(&res.UptoSeq, &res.ReadAt)
			if err != nil {
				return err
			}
		} else if err != nil {
			return err
		} else if res.UptoSeq > 0 {
			r := chat.ReadMark{ID: uuid.Must(uuid.NewV7()).String(), ChatID: chatID, UptoSeq: res.UptoSeq, ReadAt: res.ReadAt,
				Reader: reader, From: s.service}
			payload, err := json.Marshal(r)
			if err != nil {
				return err
			}
			if err := s.writerFor(chatID).Enqueue(ctx, tx, outbox.Event{ID: r.ID, Name: chat.EventMessageRead, Payload: payload}); err != nil {
				return err
			}
			enqueued = true
		}
		return tx.QueryRow(ctx, s.fq.unread, chatID, reader).Scan(&res.Unread)
	})
	if err != nil {
		return res, fmt.Errorf("mark read: %w", err)
	}
	if enqueued {
		s.eventCommitted(chatID)
	}
	return res, nil
}

// eventCommitted wakes the relays after a committed transaction that
// enqueued an event of chat chatID: the NOTIFY for other processes'
// (outbox.Writer.Committed), and this process's directly (AfterEvent),
// since a relay woken by this process's sends skips their NOTIFYs.
func (s *Store) eventCommitted(chatID int64) {
	s.writerFor(chatID).Committed()
	if s.afterEvent != nil {
		s.afterEvent(chatID)
	}
}

// ReadUpTo returns the highest seq of this service's messages in chat
// chatID that the other side's read receipts cover, and when; 0 and the
// zero time when none does.
func (s *Store) ReadUpTo(ctx context.Context, chatID int64) (int64, time.Time, error) {
	var seq int64
	var at time.Time
	err := s.pool.QueryRow(ctx, s.fq.readWatermark, chatID).Scan(&seq, &at)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, time.Time{}, nil
	}
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("read watermark: %w", err)
	}
	return seq, at, nil
}
