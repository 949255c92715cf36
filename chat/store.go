package chat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/outbox"
)

// Store writes and reads one service's chat tables.
//
// Send is the transactional-outbox write: the per-chat counter row is
// locked, the message and its outbox event are inserted, and everything
// commits together or not at all (invariant 1). A Store is safe for
// concurrent use.
type Store struct {
	pool    *pgxpool.Pool
	service string
	writer  *outbox.Writer
	q       queries
	// afterCommit, when set, is called after every committed Send (the
	// in-process gateway's wake-up). It must not block.
	afterCommit func(chatID int64)
}

// queries holds the service's schema-qualified SQL.
type queries struct {
	nextSeq, insertMessage, history, historyInbox string
}

func newQueries(service string) queries {
	s := pgx.Identifier{service}.Sanitize()
	return queries{
		// The upsert takes the chat row's lock until commit: concurrent sends
		// to one chat serialise here, so seq order = commit order and the
		// outbox ids of one chat are in seq order (invariant 5).
		nextSeq: `INSERT INTO ` + s + `.chats AS c (chat_id, last_seq) VALUES ($1, 1)
			ON CONFLICT (chat_id) DO UPDATE SET last_seq = c.last_seq + 1 RETURNING last_seq`,
		insertMessage: `INSERT INTO ` + s + `.messages (chat_id, seq, body) VALUES ($1, $2, $3)
			RETURNING id::text, created_at`,
		history: `SELECT id::text, chat_id, seq, body, created_at FROM ` + s + `.messages
			WHERE chat_id = $1 AND seq > $2 ORDER BY seq LIMIT $3`,
		historyInbox: `SELECT message_id::text, chat_id, seq, body, sent_at, received_at, sender FROM ` + s + `.inbox
			WHERE chat_id = $1 AND seq > $2 ORDER BY seq LIMIT $3`,
	}
}

// NewStore returns a Store for service (Consumers or Workers) on pool, whose
// sends enqueue through writer (the service's outbox). pool's role must own
// the service's schema.
func NewStore(pool *pgxpool.Pool, service string, writer *outbox.Writer) (*Store, error) {
	if err := checkService(service); err != nil {
		return nil, err
	}
	if pool == nil || writer == nil {
		return nil, errors.New("chat: NewStore needs a pool and an outbox writer")
	}
	return &Store{pool: pool, service: service, writer: writer, q: newQueries(service)}, nil
}

// Send stores a message in chat chatID and its message.created outbox event
// in one transaction, then wakes the relay (outbox.Writer.Committed). body
// must already be valid (ValidateBody). It returns the stored message, or an
// error wrapping the database's (nothing is stored then).
func (s *Store) Send(ctx context.Context, chatID int64, body string) (Message, error) {
	m := Message{ChatID: chatID, Body: body, From: s.service}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, s.q.nextSeq, chatID).Scan(&m.Seq); err != nil {
			return fmt.Errorf("next seq: %w", err)
		}
		if err := tx.QueryRow(ctx, s.q.insertMessage, chatID, m.Seq, body).Scan(&m.ID, &m.SentAt); err != nil {
			return fmt.Errorf("insert message: %w", err)
		}
		payload, err := json.Marshal(m)
		if err != nil {
			return fmt.Errorf("encode event: %w", err)
		}
		return s.writer.Enqueue(ctx, tx, outbox.Event{ID: m.ID, Name: EventMessageCreated, Payload: payload})
	})
	if err != nil {
		return Message{}, fmt.Errorf("send: %w", err)
	}
	s.writer.Committed()
	if s.afterCommit != nil {
		s.afterCommit(chatID)
	}
	return m, nil
}

// History is one page of a chat as this service sees it.
//
// Sent holds this service's own messages with seq > the sent cursor,
// Received the other service's with seq > the received cursor, each in seq
// order and at most limit long. More is true when either list was cut at
// limit: ask again with the last seqs as cursors.
type History struct {
	Sent, Received []Message
	More           bool
}

// History returns chat chatID's messages after the given cursors (seqs of
// this service's own messages and of the other's). limit caps each list
// (1..10000).
func (s *Store) History(ctx context.Context, chatID, afterSent, afterReceived int64, limit int) (History, error) {
	var h History
	rows, err := s.pool.Query(ctx, s.q.history, chatID, afterSent, limit)
	if err != nil {
		return h, fmt.Errorf("history: %w", err)
	}
	h.Sent, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Message, error) {
		m := Message{From: s.service}
		err := r.Scan(&m.ID, &m.ChatID, &m.Seq, &m.Body, &m.SentAt)
		return m, err
	})
	if err != nil {
		return h, fmt.Errorf("history: %w", err)
	}
	rows, err = s.pool.Query(ctx, s.q.historyInbox, chatID, afterReceived, limit)
	if err != nil {
		return h, fmt.Errorf("history inbox: %w", err)
	}
	h.Received, err = pgx.CollectRows(rows, scanInbox)
	if err != nil {
		return h, fmt.Errorf("history inbox: %w", err)
	}
	h.More = len(h.Sent) == limit || len(h.Received) == limit
	return h, nil
}

func scanInbox(r pgx.CollectableRow) (Message, error) {
	var m Message
	var recv time.Time
	err := r.Scan(&m.ID, &m.ChatID, &m.Seq, &m.Body, &m.SentAt, &recv, &m.From)
	m.ReceivedAt = &recv
	return m, err
}
