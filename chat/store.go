package chat

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/internal/service"
	"github.com/outboxchat/outboxchat/outbox"
)

// Store writes and reads one service's chat tables.
//
// Send is the transactional-outbox write: the chat's counter row is locked,
// the message and its outbox event are inserted, and everything commits
// together or not at all (invariant 1). While the Store is started (Start),
// concurrent sends are group-committed: one committer goroutine takes every
// queued send (up to MaxSendBatch) as soon as its previous commit finished
// and commits them in one transaction (see batch.go); when it is not
// started, each Send runs its own transaction in the caller's goroutine. A
// Store is safe for concurrent use.
type Store struct {
	pool    *pgxpool.Pool
	service string
	writer  *outbox.Writer
	q       queries
	// afterCommit, when set, is called after every committed transaction
	// with its messages, in seq order per chat (the in-process gateway's
	// Offer and the relay's wake-up). It must not block. Set it before
	// Start.
	afterCommit func(ms []Message)

	// Group commit (batch.go). life runs the committers; mu guards queue
	// and run; cond (on mu) wakes the committers when the queue grows or
	// stopping is set.
	life  service.Lifecycle
	mu    sync.Mutex
	cond  *sync.Cond
	queue []*sendReq
	run   *storeRun // the latest run; nil before the first Start
}

// queries holds the service's schema-qualified SQL.
type queries struct {
	nextSeq, insertMessage, sendBatch, history, historyInbox string
}

func newQueries(service string) queries {
	s := pgx.Identifier{service}.Sanitize()
	return queries{
		// nextSeq and insertMessage: the v1 dual writer's send (one message
		// per transaction). The upsert takes the chat row's lock until
		// commit: concurrent sends to one chat serialise here, so seq order
		// = commit order.
		nextSeq: `INSERT INTO ` + s + `.chats AS c (chat_id, last_seq) VALUES ($1, 1)
			ON CONFLICT (chat_id) DO UPDATE SET last_seq = c.last_seq + 1 RETURNING last_seq`,
		insertMessage: `INSERT INTO ` + s + `.messages (chat_id, seq, body, author) VALUES ($1, $2, $3, NULLIF($4, ''))
			RETURNING id::text, created_at`,
		// sendBatch numbers and inserts one transaction's messages in one
		// round trip. $1 are the distinct chats, ascending, $2 the number of
		// messages of each; $3..$6 are per message: id, chat, distance from
		// the chat's last message of the batch (0 for the last), body, and
		// $7 the author ('' stored as NULL: no auth).
		//
		// The counter upsert locks the chats' rows until commit, in chat_id
		// order (ORDER BY 1), so concurrent transactions that share chats
		// cannot deadlock, and seq order = commit order per chat (invariant
		// 5): a later transaction's outbox ids, taken after it got the lock,
		// exceed every id of the one it waited for. Each chat's counter moves
		// by its message count; the batch's messages take the seqs just
		// below the new value. now() is the transaction's start time, one
		// value for the whole batch: created_at and SentAt agree. The last
		// column counts the inserted messages, a check that every message
		// found its chat.
		sendBatch: `WITH counters AS (
				INSERT INTO ` + s + `.chats AS c (chat_id, last_seq)
				SELECT * FROM unnest($1::bigint[], $2::bigint[]) ORDER BY 1
				ON CONFLICT (chat_id) DO UPDATE SET last_seq = c.last_seq + EXCLUDED.last_seq
				RETURNING chat_id, last_seq
			), inserted AS (
				INSERT INTO ` + s + `.messages (id, chat_id, seq, body, author, created_at)
				SELECT u.id::uuid, u.chat_id, counters.last_seq - u.back, u.body, NULLIF(u.author, ''), now()
				FROM unnest($3::text[], $4::bigint[], $5::bigint[], $6::text[], $7::text[]) AS u(id, chat_id, back, body, author)
				JOIN counters USING (chat_id)
				RETURNING 1
			)
			SELECT chat_id, last_seq, now(), (SELECT count(*) FROM inserted) FROM counters`,
		history: `SELECT id::text, chat_id, seq, body, created_at, coalesce(author, '') FROM ` + s + `.messages
			WHERE chat_id = $1 AND seq > $2 ORDER BY seq LIMIT $3`,
		historyInbox: `SELECT message_id::text, chat_id, seq, body, sent_at, received_at, sender, coalesce(author, '') FROM ` + s + `.inbox
			WHERE chat_id = $1 AND seq > $2 ORDER BY seq LIMIT $3`,
	}
}

// NewStore returns a Store for service (Consumers or Workers) on pool, whose
// sends enqueue through writer (the service's outbox). pool's role must own
// the service's schema. The Store is not started: call Start to
// group-commit sends, and Stop before closing pool.
func NewStore(pool *pgxpool.Pool, service string, writer *outbox.Writer) (*Store, error) {
	if err := checkService(service); err != nil {
		return nil, err
	}
	if pool == nil || writer == nil {
		return nil, errors.New("chat: NewStore needs a pool and an outbox writer")
	}
	s := &Store{pool: pool, service: service, writer: writer, q: newQueries(service)}
	s.life.Name = "chat: store"
	s.cond = sync.NewCond(&s.mu)
	return s, nil
}

// Send stores a message in chat chatID and its message.created outbox event
// in one transaction, then wakes the relay (outbox.Writer.Committed). body
// must already be valid (ValidateBody). It returns the stored message, or an
// error wrapping the database's (nothing is stored then).
//
// While the Store is started, the send is queued and committed by the
// committer together with the other sends queued meanwhile, in one
// transaction: they all commit or none does, and a failed transaction's
// error is returned to each of them. Per chat, the sends of one transaction
// take consecutive seqs in the order they were queued. If ctx ends while the
// send is still queued, Send returns ctx.Err() (wrapped) and nothing is
// stored; once the committer has taken it, it is committed (or fails)
// regardless of ctx, within sendBatchTimeout (10 s), and Send waits for the
// outcome. When the Store is not started (or is stopping), Send commits the
// message alone in the caller's goroutine under ctx.
//
// A chatID ≤ 0, or a body that is not valid UTF-8 or holds a NUL, which the
// database would refuse, is rejected up front with a *FieldError (wrapped)
// so that it cannot fail other senders' transaction. Safe for concurrent use.
func (s *Store) Send(ctx context.Context, chatID int64, body string) (Message, error) {
	switch {
	case chatID <= 0:
		return Message{}, fmt.Errorf("send: %w", &FieldError{Field: "chat_id", Msg: "must be a positive 64-bit integer"})
	case !utf8.ValidString(body):
		return Message{}, fmt.Errorf("send: %w", &FieldError{Field: "body", Msg: "is not valid UTF-8"})
	case strings.IndexByte(body, 0) >= 0:
		return Message{}, fmt.Errorf("send: %w", &FieldError{Field: "body", Msg: "must not contain NUL characters"})
	}
	if err := ctx.Err(); err != nil {
		return Message{}, fmt.Errorf("send: %w", err)
	}
	r := &sendReq{ctx: ctx, chatID: chatID, body: body, author: authorOf(ctx), done: make(chan sendResult, 1)}
	if !s.enqueue(r) {
		ms, err := s.commitBatch(ctx, []*sendReq{r})
		if err != nil {
			return Message{}, fmt.Errorf("send: %w", err)
		}
		return ms[0], nil
	}
	select {
	case res := <-r.done:
		return res.m, res.err
	case <-ctx.Done():
		if r.state.CompareAndSwap(reqQueued, reqDropped) {
			return Message{}, fmt.Errorf("send: %w", ctx.Err())
		}
		// Taken: it is being committed; wait for the outcome.
		res := <-r.done
		return res.m, res.err
	}
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
		err := r.Scan(&m.ID, &m.ChatID, &m.Seq, &m.Body, &m.SentAt, &m.Author)
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
	err := r.Scan(&m.ID, &m.ChatID, &m.Seq, &m.Body, &m.SentAt, &recv, &m.From, &m.Author)
	m.ReceivedAt = &recv
	return m, err
}
