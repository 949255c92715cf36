package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/schema"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/internal/service"
	"github.com/outboxchat/outboxchat/outbox"
)

// Store writes and reads one service's chat tables.
//
// Send is the transactional-outbox write: the chat's advisory lock is taken,
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
	// writers are the writers of the partitions (Config.Writers), one
	// per partition; len 1 without partitions.
	writers []*outbox.Writer
	q       queries
	fq      featureQueries
	// afterCommit, headers, lockTimeout, readTimeout, metrics: Config's, defaults
	// applied.
	afterCommit              func(ms []chat.Message)
	afterEvent               func(chatID int64)
	headers                  func(ctx context.Context) map[string]string
	onBatch                  func(ctxs []context.Context, began time.Time, err error)
	lockTimeout, readTimeout time.Duration
	metrics                  *SendMetrics
	log                      *slog.Logger
	// hints are the chats' seq hints (batch.go): what lets a batch commit
	// in one round trip.
	hints seqHints

	// Group commit (batch.go). life runs the committers and the slow
	// lanes; mu guards queue, slow and run; cond (on mu) wakes the
	// committers when the queue grows or stopping is set.
	life    service.Lifecycle
	mu      sync.Mutex
	cond    *sync.Cond
	queue   []*sendReq
	slow    map[int64]*slowChat // chats whose sends wait in a slow lane
	slowSem chan struct{}       // one token per slow lane holding a connection
	run     *storeRun           // the latest run; nil before the first Start
}

// SendMetrics receives send outcomes, e.g. to feed Prometheus. Every field
// is optional; set ones must be cheap, non-blocking and safe for concurrent
// use.
type SendMetrics struct {
	// Rejected is called once per send that failed on a timeout; reason is
	// "lock_timeout" (chat.ErrChatBusy) or "timeout" (chat.ErrSendTimeout).
	Rejected func(reason string)
	// Replayed is called once per send answered with the message an earlier
	// send with the same idempotency key stored.
	Replayed func()
	// CommitAnswerLost is called once per send transaction whose COMMIT
	// was sent but whose answer was lost (a connection cut, a terminated
	// backend, a deadline), after the Store read the outcome on another
	// connection: outcome is "stored" (its sends are answered as stored),
	// "not_stored" (answered with the error) or "unknown"
	// (chat.ErrSendOutcomeUnknown).
	CommitAnswerLost func(outcome string)
}

// DefaultReadTimeout bounds one History call (Config.ReadTimeout).
const DefaultReadTimeout = 5 * time.Second

// slowLanesFor is the number of slow lanes a pool of maxConns connections
// gets: a quarter of it, at least 1 and at most 4, so that chats waiting for
// their locks leave the other roles connections.
func slowLanesFor(maxConns int32) int {
	return int(min(max(maxConns/4, 1), 4))
}

// queries holds the service's schema-qualified SQL.
type queries struct {
	lockChat, tryLockChats, tryLockChatsCounted, lastSeqs, findKeys, insertMessages, insertMessagesChecked, insertOne, messageStored, history, historyInbox, watermark string
}

// lastSeqSQL is the SQL expression for chat c's last seq in schema s (an
// identifier already quoted): see queries.lastSeqs.
func lastSeqSQL(s, c string) string {
	return `greatest(coalesce((SELECT max(m.seq) FROM ` + s + `.messages m WHERE m.chat_id = ` + c + `), 0),
		coalesce((SELECT f.seq FROM ` + s + `.seq_floors f WHERE f.chat_id = ` + c + ` ORDER BY f.seq DESC LIMIT 1), 0))`
}

func newQueries(service string) queries {
	s := pgx.Identifier{service}.Sanitize()
	return queries{
		// lockChat waits (at most lock_timeout) for chat $1's advisory
		// lock; tryLockChats takes the locks of those of chats $1 that are
		// free and returns them, without waiting. See batch.go: the lock is
		// what makes seq gap-free and equal to commit order per chat.
		lockChat: `SELECT pg_advisory_xact_lock(` + schema.ChatLockSQL(service, "$1::bigint") + `)`,
		// messageStored: whether message $1 is stored (the primary key),
		// read under its chat's lock by a send whose COMMIT's answer was
		// lost (batch.go, outcomeOf).
		messageStored: `SELECT EXISTS (SELECT 1 FROM ` + s + `.messages WHERE id = $1::uuid)`,
		tryLockChats:  `SELECT c FROM unnest($1::bigint[]) AS c WHERE pg_try_advisory_xact_lock(` + schema.ChatLockSQL(service, "c") + `)`,
		// tryLockChatsCounted is tryLockChats for a one-round-trip batch
		// (batch.go's seq hints): it returns nothing, and leaves the number
		// of chats it could not lock in the transaction-local setting
		// outboxchat.chats_not_locked, for insertMessagesChecked to read.
		tryLockChatsCounted: `SELECT set_config('outboxchat.chats_not_locked',
			(count(*) FILTER (WHERE NOT pg_try_advisory_xact_lock(` + schema.ChatLockSQL(service, "c") + `)))::text, true)
			FROM unnest($1::bigint[]) AS c`,
		// lastSeqs: each chat's last seq (0 for none). Run after the
		// locks, as a statement of its own: its snapshot then sees the
		// previous lock holder's commit. The last seq is the greater of
		// the chat's max(seq) and its newest seq floor (what a DELETE of its
		// messages took away, or a receipt above its rows said the other
		// side holds): seq never goes backwards whatever deleted rows here
		// (migration 008). Two backward index steps per chat; nothing
		// written per send. Not the newest receipt as well: measured in
		// lab bench, that third step per chat and batch cost 5 % of the
		// throughput, and a receipt records a floor in the rare case it
		// teaches anything (receive's apply).
		lastSeqs: `SELECT c, ` + lastSeqSQL(s, "c") + `
			FROM unnest($1::bigint[]) AS c`,
		// findKeys: the messages already stored under the given (chat,
		// idempotency key) pairs: one lookup of index messages_client_id
		// per pair. OFFSET 0 keeps the LATERAL subquery a subquery: pulled
		// up into a plain join, the generic plan pgx caches while the
		// table is new (never analyzed) hash-joins a sequential scan of
		// every message, a cost that grows with the table (measured in lab
		// bench: 2.5 ms and the whole table's pages per batch at 10,000
		// messages, against 0.1 ms and 2 pages per key).
		findKeys: `SELECT u.c, u.k, m.id::text, m.seq, m.body, m.created_at, coalesce(m.author, '')
			FROM unnest($1::bigint[], $2::text[]) AS u(c, k)
			CROSS JOIN LATERAL (SELECT id, seq, body, created_at, author FROM ` + s + `.messages
				WHERE chat_id = u.c AND client_id = u.k OFFSET 0) AS m`,
		// insertMessages: the batch's new messages, numbered in Go; '' is no
		// key; $7 is the batch's sent_at.
		insertMessages: `INSERT INTO ` + s + `.messages (id, chat_id, seq, body, client_id, author, created_at)
			SELECT u.id::uuid, u.c, u.seq, u.body, nullif(u.k, ''), nullif(u.a, ''), $7::timestamptz
			FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::text[], $5::text[], $6::text[]) AS u(id, c, seq, body, k, a)`,
		// insertMessagesChecked is insertMessages numbered from seq hints,
		// after tryLockChatsCounted in the same transaction: unless every
		// lock was taken and each chat $8[i]'s last seq (lastSeqs'
		// expression, read by this statement's snapshot, taken after the
		// locks) is $9[i], every row's seq is NULL and the INSERT fails
		// with not_null_violation, which aborts the transaction before
		// its outbox INSERT and COMMIT run. The check is evaluated once
		// (an uncorrelated subquery) from the data, so the planner cannot
		// fold it into an error at plan time.
		insertMessagesChecked: `INSERT INTO ` + s + `.messages (id, chat_id, seq, body, client_id, author, created_at)
			SELECT u.id::uuid, u.c, CASE WHEN g.ok THEN u.seq END, u.body, nullif(u.k, ''), nullif(u.a, ''), $7::timestamptz
			FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::text[], $5::text[], $6::text[]) AS u(id, c, seq, body, k, a),
				(SELECT current_setting('outboxchat.chats_not_locked') = '0' AND NOT EXISTS (
					SELECT FROM unnest($8::bigint[], $9::bigint[]) AS e(c, last)
					WHERE ` + lastSeqSQL(s, "e.c") + ` <> e.last) AS ok) AS g`,
		// insertOne: the v1 dual writer's send, after lockChat in the same
		// transaction: the next seq of chat $1, as lastSeqs numbers it,
		// created at $4 (sendClock, as the group commit's sends are).
		insertOne: `INSERT INTO ` + s + `.messages (chat_id, seq, body, author, created_at)
			SELECT $1, ` + lastSeqSQL(s, "$1::bigint") + ` + 1, $2, nullif($3, ''), $4::timestamptz
			RETURNING id::text, seq, created_at`,
		// history: a page of the service's own messages, each with the
		// delivered_at of the first receipt at or above its seq (one probe
		// of the receipts' primary key per message the chat's newest
		// receipt covers; none for the rest).
		history: `SELECT ` + ownCols(s) + `
			FROM ` + s + `.messages m, ` + watermarksOf(s, "$1") + `
			WHERE m.chat_id = $1 AND m.seq > $2 ORDER BY m.seq LIMIT $3`,
		historyInbox: `SELECT ` + inboxCols + ` FROM ` + s + `.inbox i
			WHERE i.chat_id = $1 AND i.seq > $2 ORDER BY i.seq LIMIT $3`,
		// watermark: a chat's highest delivered seq and its time (the
		// newest receipt, one backward step of its primary key).
		watermark: `SELECT upto_seq, delivered_at FROM ` + s + `.receipts
			WHERE chat_id = $1 ORDER BY upto_seq DESC LIMIT 1`,
	}
}

// Config configures a Store. Service and Writer are required; a zero field
// means its default.
type Config struct {
	// Service is chat.Consumers or chat.Workers: the schema the Store
	// writes.
	Service string
	// Writer enqueues the message.created events in the service's outbox
	// (its table "<service>.outbox"). Required unless Writers is set.
	Writer *outbox.Writer
	// Writers, when it has more than one element, are the writers of the
	// partitions' outboxes (chat.OutboxTable): the events of a chat go to
	// Writers[chat.Partition(chat, len(Writers))]. Default nil: every
	// event goes through Writer (one partition). When set, Writer is
	// ignored.
	Writers []*outbox.Writer
	// LockTimeout bounds a send's wait for its chat's lock (another session
	// holds it); past it the send fails with chat.ErrChatBusy and stores
	// nothing. It is Postgres's lock_timeout, which bounds each lock wait
	// apart: a transaction that waits for the chat's lock and then for
	// another (an outbox table an operator locked) may wait up to twice
	// it. Default DefaultSendLockTimeout (2 s).
	LockTimeout time.Duration
	// ReadTimeout bounds each History read; past it the error wraps
	// chat.ErrReadTimeout. Default DefaultReadTimeout (5 s).
	ReadTimeout time.Duration
	// Metrics, when set, counts sends rejected by a timeout, idempotent
	// replays and send transactions whose COMMIT answer was lost.
	Metrics *SendMetrics
	// Logger receives a warning per send transaction whose COMMIT answer
	// was lost, with the outcome read after it. Default slog.Default().
	Logger *slog.Logger
	// AfterCommit, when set, is called after every committed transaction
	// with its messages, in seq order per chat (the in-process gateway's
	// Offer and the relay's wake-up). It must not block.
	AfterCommit func(ms []chat.Message)
	// AfterEvent, when set, is called with the chat after every committed
	// Change and MarkRead that enqueued an outbox event (an edit, a delete,
	// a read mark), after the writer's Committed: the in-process relay's
	// direct wake-up, as AfterCommit is for sends. It must not block.
	AfterEvent func(chatID int64)
	// Headers, when set, gives the headers of each message's outbox event
	// from its send's context (the server's trace context: a traceparent);
	// nil results and a nil Headers mean none. It must be fast and safe for
	// concurrent use: it runs in the committer, once per message.
	Headers func(ctx context.Context) map[string]string
	// OnBatch, when set, is called after each send transaction, committed
	// (err nil) or not, with the contexts of the sends it answered (new
	// messages and idempotent replays; not those left to a later
	// transaction) and when it began: the server's send transaction span.
	// It runs in the committer and must not block.
	OnBatch func(ctxs []context.Context, began time.Time, err error)
}

// New returns a Store on pool configured by cfg; pool's role must own the
// service's schema. It fails on an unknown service (chat.ErrUnknownService)
// or a missing pool or writer. The Store is not started: call Start to
// group-commit sends, and Stop before closing pool.
func New(pool *pgxpool.Pool, cfg *Config) (*Store, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	if err := chat.CheckService(cfg.Service); err != nil {
		return nil, err
	}
	writers := cfg.Writers
	if len(writers) == 0 {
		writers = []*outbox.Writer{cfg.Writer}
	}
	if pool == nil || slices.Contains(writers, nil) {
		return nil, errors.New("store: New needs a pool and an outbox writer")
	}
	s := &Store{pool: pool, service: cfg.Service, writer: writers[0], writers: writers, q: newQueries(cfg.Service), fq: newFeatureQueries(cfg.Service),
		lockTimeout: cmp.Or(cfg.LockTimeout, DefaultSendLockTimeout), readTimeout: cmp.Or(cfg.ReadTimeout, DefaultReadTimeout),
		metrics: cfg.Metrics, log: cmp.Or(cfg.Logger, slog.Default()), afterCommit: cfg.AfterCommit, afterEvent: cfg.AfterEvent, headers: cfg.Headers, onBatch: cfg.OnBatch,
		slowSem: make(chan struct{}, slowLanesFor(pool.Config().MaxConns))}
	s.life.Name = "chat: store"
	s.cond = sync.NewCond(&s.mu)
	return s, nil
}

// writerFor returns the writer of chatID's partition.
func (s *Store) writerFor(chatID int64) *outbox.Writer {
	return s.writers[chat.Partition(chatID, len(s.writers))]
}

// Send stores a message in chat chatID and its message.created outbox event
// in one transaction, then wakes the relay (outbox.Writer.Committed). It is
// SendIdempotent without a key.
func (s *Store) Send(ctx context.Context, chatID int64, body, author string) (chat.Message, error) {
	m, _, err := s.SendIdempotent(ctx, chatID, body, "", author)
	return m, err
}

// SendIdempotent stores a message in chat chatID and its message.created
// outbox event in one transaction, then wakes the relay
// (outbox.Writer.Committed). body must already be valid (ValidateBody). It
// returns the stored message, or an error wrapping the database's (nothing
// is stored then).
//
// key is the client's idempotency key ("" for none; else 1 to
// chat.MaxClientIDBytes bytes, ValidateClientID). If the chat already holds a
// message stored under key, nothing is stored: with the same body it
// returns that message and replayed true, with another body an error
// wrapping chat.ErrIdempotencyConflict. The key is stored with the message, in
// the same transaction, under a unique index.
//
// While the Store is started, the send is queued and committed by the
// committer together with the other sends queued meanwhile, in one
// transaction: they all commit or none does, and a failed transaction's
// error is returned to each of them. Per chat, the sends of one transaction
// take consecutive seqs in the order they were queued. A chat whose lock
// another session holds is left out and its sends wait in its slow lane, at
// most the lock timeout (DefaultSendLockTimeout), then fail with an error
// wrapping chat.ErrChatBusy (see batch.go). If ctx ends while the send is still
// queued, it returns ctx.Err() (wrapped) and nothing is stored; once a
// transaction has taken it, it is committed (or fails) regardless of ctx,
// within sendBatchTimeout (10 s), and it waits for the outcome. When the
// Store is not started (or is stopping), the send commits alone in the
// caller's goroutine under ctx. Timeouts wrap chat.ErrSendTimeout. A
// transaction whose connection fails once its COMMIT is sent is answered by
// what Postgres did, read on another connection under the chat's lock: a
// success if it committed; an error wrapping chat.ErrSendOutcomeUnknown
// (the message may be stored: retry with the same key) when that cannot be
// read, or a one-round-trip batch (batch.go's seq hints) is not found.
//
// A chatID ≤ 0, a body that is not valid UTF-8 or holds a NUL, or an invalid
// key, which the database would refuse, is rejected up front with a
// *FieldError (wrapped) so that it cannot fail other senders' transaction.
// author is stored with the message ("" for none: auth off).
//
// Safe for concurrent use.
func (s *Store) SendIdempotent(ctx context.Context, chatID int64, body, key, author string) (m chat.Message, replayed bool, err error) {
	switch {
	case chatID <= 0:
		return chat.Message{}, false, fmt.Errorf("send: %w", &chat.FieldError{Field: "chat_id", Msg: "must be a positive 64-bit integer"})
	case !utf8.ValidString(body):
		return chat.Message{}, false, fmt.Errorf("send: %w", &chat.FieldError{Field: "body", Msg: "is not valid UTF-8"})
	case strings.IndexByte(body, 0) >= 0:
		return chat.Message{}, false, fmt.Errorf("send: %w", &chat.FieldError{Field: "body", Msg: "must not contain NUL characters"})
	}
	if key != "" {
		if err := chat.ValidateClientID("client_id", key); err != nil {
			return chat.Message{}, false, fmt.Errorf("send: %w", err)
		}
	}
	if err := ctx.Err(); err != nil {
		return chat.Message{}, false, fmt.Errorf("send: %w", err)
	}
	r := &sendReq{ctx: ctx, chatID: chatID, body: body, key: key, author: author, queued: time.Now(), done: make(chan sendResult, 1)}
	var res sendResult
	if !s.enqueue(r) {
		rs, _, err := s.commitBatch(ctx, []*sendReq{r}, true, s.lockTimeout)
		if err != nil {
			res.err = fmt.Errorf("send: %w", err)
		} else {
			res = *rs[0]
		}
	} else {
		select {
		case res = <-r.done:
		case <-ctx.Done():
			if r.state.CompareAndSwap(reqQueued, reqDropped) {
				return chat.Message{}, false, fmt.Errorf("send: %w", ctx.Err())
			}
			// Taken: it is being committed; wait for the outcome.
			res = <-r.done
		}
	}
	s.count(res)
	return res.m, res.replayed, res.err
}

// count reports res to the metrics hook.
func (s *Store) count(res sendResult) {
	if s.metrics == nil {
		return
	}
	switch {
	case res.replayed && s.metrics.Replayed != nil:
		s.metrics.Replayed()
	case s.metrics.Rejected == nil || res.err == nil:
	case errors.Is(res.err, chat.ErrChatBusy):
		s.metrics.Rejected("lock_timeout")
	case errors.Is(res.err, chat.ErrSendTimeout):
		s.metrics.Rejected("timeout")
	}
}

// History returns chat chatID's messages after the given cursors (seqs of
// this service's own messages and of the other's). limit caps each list
// (1..10000). It runs under the read timeout (DefaultReadTimeout, 5 s):
// past it, the error wraps chat.ErrReadTimeout.
func (s *Store) History(ctx context.Context, chatID, afterSent, afterReceived int64, limit int) (h chat.History, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.readTimeout)
	defer cancel()
	defer func() {
		if err != nil && ctx.Err() == context.DeadlineExceeded {
			err = fmt.Errorf("%w: %w", chat.ErrReadTimeout, err)
		}
	}()
	rows, err := s.pool.Query(ctx, s.q.history, chatID, afterSent, limit)
	if err != nil {
		return h, fmt.Errorf("history: %w", err)
	}
	h.Sent, err = pgx.CollectRows(rows, s.scanOwn)
	if err != nil {
		return h, fmt.Errorf("history: %w", err)
	}
	rows, err = s.pool.Query(ctx, s.q.historyInbox, chatID, afterReceived, limit)
	if err != nil {
		return h, fmt.Errorf("history inbox: %w", err)
	}
	h.Received, err = pgx.CollectRows(rows, scanInboxFull)
	if err != nil {
		return h, fmt.Errorf("history inbox: %w", err)
	}
	h.More = len(h.Sent) == limit || len(h.Received) == limit
	return h, nil
}

// DeliveredUpTo returns the highest seq of this service's messages in chat
// chatID that the other service's receipts marked delivered, and when; 0
// and the zero time when none is. Receipts are cumulative, so every message
// up to that seq is delivered.
func (s *Store) DeliveredUpTo(ctx context.Context, chatID int64) (int64, time.Time, error) {
	var seq int64
	var at time.Time
	err := s.pool.QueryRow(ctx, s.q.watermark, chatID).Scan(&seq, &at)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, time.Time{}, nil
	}
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("delivered watermark: %w", err)
	}
	return seq, at, nil
}
