package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/jsonscan"
	"github.com/outboxchat/outboxchat/chat/schema"
	"github.com/outboxchat/outboxchat/outbox"
)

// Fence keeps a chat's seq from going backwards when the database loses
// commits that had already left it: a failover to an asynchronous replica
// that had not received them, or a point-in-time restore. The floors of
// migration 008 remember what a DELETE takes away; lost commits leave
// nothing behind in the database, so the Fence keeps, in Redis, the
// highest seq per chat that the service's relay has published (Publisher,
// one script call per relay batch, before the batch is published), and
// checks each new database connection's incarnation — the cluster's
// system identifier and WAL timeline, which a promotion or a restore
// changes (Check). The first connection to an incarnation not yet fenced
// (table seq_epochs, migration 014) fences it, in one transaction under
// an advisory lock: every chat whose high-water mark is above its last
// seq in the database (the newest message or seq floor) gets a seq floor
// at the mark, so sends go on above it; seq_lost records the seqs in
// between (published, then lost with the old primary: `status` reports
// them); and one seq.floor event (chat.EventSeqFloor) tells the receiver
// not to wait for them. Until that commits the connection is not handed
// out, so no send runs on the new incarnation unfenced.
//
// Limits: behind a transaction-mode pooler (PgBouncer) the pooler
// reconnects to a promoted server without a new client connection, so
// Check runs when the service's own connections are replaced, not at the
// promotion; and a Redis that lost its data too (no AOF) cannot fence.
//
// A Fence is safe for concurrent use.
type Fence struct {
	rdb     redis.UniversalClient
	key     string
	service string
	log     *slog.Logger

	mu sync.Mutex
	// writers are the outbox writers of the partitions (SetWriter).
	writers []*outbox.Writer
	fenced  map[epoch]bool
}

// ErrNotFenced is returned (wrapped) by the Check of a Fence without
// Redis on a connection to a database incarnation no process has fenced
// yet: sends wait (the pool's acquire fails, the API answers 503) until
// the relay's or the worker's process fences it.
var ErrNotFenced = errors.New("seq fence: the database is a new incarnation (failover or restore) not fenced yet")

// epoch is a database incarnation.
type epoch struct {
	systemID string
	timeline int
}

// raiseHWM raises the high-water marks of KEYS[1] (a hash: chat id →
// seq): ARGV holds chat, seq pairs; a mark only goes up. Returns nothing.
var raiseHWM = redis.NewScript(`
for i = 1, #ARGV, 2 do
  local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0')
  if tonumber(ARGV[i + 1]) > cur then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
return 0
`)

// NewFence returns the Fence of service's seqs, keeping its high-water
// marks in rdb under key prefix prefix (schema.SeqHighWaterKey). log nil
// means slog.Default(). SetWriter must be called before the first Check
// that has to fence. rdb nil (a process without Redis, e.g. the api role
// alone) makes a Fence that cannot fence: its Check refuses connections to
// an incarnation not yet fenced (ErrNotFenced) until a process with Redis
// (the relay's, the worker's) has fenced it; Publisher must not be used.
func NewFence(rdb redis.UniversalClient, prefix, service string, log *slog.Logger) (*Fence, error) {
	if err := chat.CheckService(service); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	return &Fence{rdb: rdb, key: schema.SeqHighWaterKey(prefix, service), service: service,
		log: log.With("component", "seq_fence"), fenced: map[epoch]bool{}}, nil
}

// SetWriter sets the outbox writers through which a fence enqueues its
// seq.floor events: one writer (the service's outbox), or one per
// partition (ws[p] for partition p, chat.OutboxTable), so that a chat's
// floor takes its partition's lane.
func (f *Fence) SetWriter(ws ...*outbox.Writer) {
	f.mu.Lock()
	f.writers = ws
	f.mu.Unlock()
}

// Publisher returns next behind the Fence: before next publishes a batch,
// the batch's highest seq per chat of its message.created events is raised
// in Redis (one script call). An error there is returned as a plain error
// (Redis is down: the relay retries the batch), so nothing is published
// above the marks. Payloads that do not decode are passed on untouched
// (next refuses them).
func (f *Fence) Publisher(next outbox.Publisher) outbox.Publisher {
	return outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) error {
		if top := highWaterMarks(msgs); len(top) > 0 {
			args := make([]any, 0, 2*len(top))
			for c, s := range top {
				args = append(args, c, s)
			}
			if err := raiseHWM.Run(ctx, f.rdb, []string{f.key}, args...).Err(); err != nil && !errors.Is(err, redis.Nil) {
				return fmt.Errorf("seq fence: raise high-water marks: %w", err)
			}
		}
		return next.Publish(ctx, msgs)
	})
}

// highWaterMarks returns the highest seq per chat of msgs' message.created
// events (nil for none); payloads that do not decode, or whose chat_id is
// not positive, are left out.
func highWaterMarks(msgs []outbox.Message) map[int64]int64 {
	var top map[int64]int64
	for _, m := range msgs {
		if m.Event != chat.EventMessageCreated {
			continue
		}
		chatID, seq, ok := scanChatSeq(m.Payload)
		if !ok {
			var ev struct {
				ChatID int64 `json:"chat_id"`
				Seq    int64 `json:"seq"`
			}
			if json.Unmarshal(m.Payload, &ev) != nil {
				continue
			}
			chatID, seq = ev.ChatID, ev.Seq
		}
		if chatID <= 0 {
			continue
		}
		if top == nil {
			top = map[int64]int64{}
		}
		top[chatID] = max(top[chatID], seq)
	}
	return top
}

// scanChatSeq is highWaterMarks' fast path: it reads chat_id and seq as
// json.Unmarshal into the struct of both would, without its reflection and
// allocations, from a valid JSON object whose keys are plain ASCII (no
// escapes) and whose chat_id and seq, where present, are integers that fit
// int64 (absent ones are 0). For anything else (invalid JSON, a key
// json.Unmarshal would match case-insensitively, an escaped or non-ASCII
// key, a null, string, fractional, exponent or overflowing chat_id or seq,
// deep nesting) it returns ok false, and the caller asks json.Unmarshal.
func scanChatSeq(p []byte) (chatID, seq int64, ok bool) {
	s := jsonscan.Scanner{P: p}
	s.Space()
	if !s.Byte('{') {
		return 0, 0, false
	}
	s.Space()
	if !s.Byte('}') {
		for {
			from, to, plain, _ := s.Str()
			if !plain {
				return 0, 0, false
			}
			s.Space()
			if !s.Byte(':') {
				return 0, 0, false
			}
			s.Space()
			var dst *int64
			switch key := string(p[from:to]); {
			case key == "chat_id":
				dst = &chatID
			case key == "seq":
				dst = &seq
			case strings.EqualFold(key, "chat_id"), strings.EqualFold(key, "seq"):
				return 0, 0, false
			}
			if dst != nil {
				n, ok := s.Int64()
				if !ok {
					return 0, 0, false
				}
				*dst = n
			} else if !s.Value(0) {
				return 0, 0, false
			}
			s.Space()
			if s.Byte('}') {
				break
			}
			if !s.Byte(',') {
				return 0, 0, false
			}
			s.Space()
		}
	}
	s.Space()
	return chatID, seq, s.I == len(p)
}

// Check is a pgxpool AfterConnect hook: it reads conn's database
// incarnation and, unless it is known fenced, fences it (see Fence) before
// conn is used. It returns an error (the pool then drops conn, and the
// caller's acquire fails) when the incarnation cannot be read or fenced,
// e.g. while Redis is down after a failover. The first incarnation a
// service ever runs on (seq_epochs empty) is recorded without reading
// Redis: there is nothing to fence yet. It must run after the migrations
// (it reads seq_epochs): before, it does nothing.
func (f *Fence) Check(ctx context.Context, conn *pgx.Conn) error {
	var ep epoch
	var migrated bool
	err := conn.QueryRow(ctx, `SELECT s.system_identifier::text,
			('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int,
			to_regclass($1) IS NOT NULL
		FROM pg_control_system() s`, f.service+".seq_epochs").Scan(&ep.systemID, &ep.timeline, &migrated)
	if err != nil {
		return fmt.Errorf("seq fence: read the database's incarnation: %w", err)
	}
	if !migrated {
		return nil
	}
	f.mu.Lock()
	known, w := f.fenced[ep], f.writers
	f.mu.Unlock()
	if known {
		return nil
	}
	if err := f.fence(ctx, conn, ep, w); err != nil {
		return err
	}
	f.mu.Lock()
	f.fenced[ep] = true
	f.mu.Unlock()
	return nil
}

// fenceBatch bounds the chats of one floor statement (and one seq.floor
// event, below chat.MaxReceiptChats).
const fenceBatch = 1000

// fence fences incarnation ep on conn (see Fence).
func (f *Fence) fence(ctx context.Context, conn *pgx.Conn, ep epoch, w []*outbox.Writer) error {
	s := pgx.Identifier{f.service}.Sanitize()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("seq fence: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var done, first bool
	if err := tx.QueryRow(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0)) IS NULL,
			EXISTS (SELECT 1 FROM `+s+`.seq_epochs WHERE system_id = $2 AND timeline = $3),
			NOT EXISTS (SELECT 1 FROM `+s+`.seq_epochs)`,
		f.service+".seq_fence", ep.systemID, ep.timeline).Scan(new(bool), &done, &first); err != nil {
		return fmt.Errorf("seq fence: %w", err)
	}
	if done {
		return tx.Commit(ctx)
	}
	var lost []chat.ReceiptChat
	var lostSeqs int64
	if !first {
		if f.rdb == nil {
			return fmt.Errorf("%w: system %s timeline %d", ErrNotFenced, ep.systemID, ep.timeline)
		}
		if len(w) == 0 || slices.Contains(w, nil) {
			return errors.New("seq fence: no outbox writer set")
		}
		var cursor uint64
		for {
			kv, next, err := f.rdb.HScan(ctx, f.key, cursor, "", fenceBatch).Result()
			if err != nil {
				return fmt.Errorf("seq fence: read high-water marks: %w", err)
			}
			var chats, marks []int64
			for i := 0; i+1 < len(kv); i += 2 {
				c, err1 := strconv.ParseInt(kv[i], 10, 64)
				m, err2 := strconv.ParseInt(kv[i+1], 10, 64)
				if err1 == nil && err2 == nil && c > 0 && m > 0 {
					chats, marks = append(chats, c), append(marks, m)
				}
			}
			if len(chats) > 0 {
				rows, err := tx.Query(ctx, `WITH h AS (SELECT h.chat_id, h.mark, `+lastSeqSQL(s, "h.chat_id")+` AS last
					FROM unnest($1::bigint[], $2::bigint[]) AS h(chat_id, mark)),
				l AS (INSERT INTO `+s+`.seq_lost (chat_id, from_seq, to_seq, system_id, timeline)
					SELECT chat_id, last + 1, mark, $3, $4 FROM h WHERE mark > last
					ON CONFLICT DO NOTHING),
				fl AS (INSERT INTO `+s+`.seq_floors (chat_id, seq)
					SELECT chat_id, mark FROM h WHERE mark > last ON CONFLICT DO NOTHING)
				SELECT chat_id, mark, mark - last FROM h WHERE mark > last ORDER BY chat_id`,
					chats, marks, ep.systemID, ep.timeline)
				if err != nil {
					return fmt.Errorf("seq fence: %w", err)
				}
				for rows.Next() {
					var c chat.ReceiptChat
					var n int64
					if err := rows.Scan(&c.ChatID, &c.UptoSeq, &n); err != nil {
						rows.Close()
						return fmt.Errorf("seq fence: %w", err)
					}
					lost, lostSeqs = append(lost, c), lostSeqs+n
				}
				if err := rows.Err(); err != nil {
					return fmt.Errorf("seq fence: %w", err)
				}
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
		// Each chat's floor goes through its partition's outbox.
		byPart := chat.SplitByPartition(len(w), lost, func(i int) int64 { return lost[i].ChatID })
		for p, chats := range byPart {
			for start := 0; start < len(chats); start += fenceBatch {
				part := chats[start:min(start+fenceBatch, len(chats))]
				r := chat.Receipt{ID: uuid.NewString(), Chats: part, ReceivedAt: time.Now().UTC(), From: f.service}
				payload, err := json.Marshal(r)
				if err != nil {
					return fmt.Errorf("seq fence: %w", err)
				}
				if err := w[p].Enqueue(ctx, tx, outbox.Event{ID: r.ID, Name: chat.EventSeqFloor, Payload: payload}); err != nil {
					return fmt.Errorf("seq fence: %w", err)
				}
			}
		}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+s+`.seq_epochs (system_id, timeline) VALUES ($1, $2) ON CONFLICT DO NOTHING`,
		ep.systemID, ep.timeline); err != nil {
		return fmt.Errorf("seq fence: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("seq fence: %w", err)
	}
	if len(lost) > 0 {
		for _, w := range w {
			w.Committed()
		}
	}
	if first {
		f.log.Info("seq fence: first database incarnation recorded", "system_id", ep.systemID, "timeline", ep.timeline)
	} else {
		f.log.Warn("seq fence: new database incarnation fenced", "system_id", ep.systemID, "timeline", ep.timeline,
			"chats_fenced", len(lost), "seqs_lost", lostSeqs)
	}
	return nil
}
