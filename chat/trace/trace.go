// Package trace follows one message across both services for `outboxchat
// trace`: where it is and when it got to each stage — stored by its
// sender, in the sender's outbox (pending, parked), added to the stream
// (each entry: pending, acknowledged, not yet read, trimmed), dead-lettered,
// re-driven, stored in the receiver's inbox (held behind a gap or shown),
// and covered by the receiver's receipt (delivered_at).
//
// Everything is read on demand from what the pipeline keeps anyway (the
// sender's messages, outbox and receipts, the receiver's inbox — which
// keeps the stream entry id it was stored from, migration 011 — the
// stream, its consumer group and its dead letters); nothing is recorded
// per message for it. Times are the database's clock, except the stream
// entries' and dead letters', which are Redis's (an entry id's first part
// is the milliseconds at which it was added).
package trace

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/schema"
	"github.com/outboxchat/outboxchat/redisq"
)

// ErrNotFound is returned (wrapped) when neither service stored the
// message asked for.
var ErrNotFound = errors.New("no such message")

// ErrAmbiguous is returned (wrapped) by Find when both services have a
// message at that chat and seq (each numbers its own): name the service.
var ErrAmbiguous = errors.New("both services have a message there")

// Stage names (Stage.Stage), in the order of a message's way.
const (
	StageStored       = "stored"
	StageOutbox       = "outbox"
	StagePublished    = "published"
	StageDeadLettered = "dead_lettered"
	StageRedriven     = "redriven"
	StageReceived     = "received"
	StageDelivered    = "delivered"
)

// States of a stage (Stage.State).
const (
	// StageOutbox.
	StatePending = "pending" // waiting for the relay (also: a stream entry delivered, not acknowledged)
	StateParked  = "parked"  // taken out after failed publishes (`outboxchat outbox parked|retry`)
	// StagePublished.
	StateAcked       = "acked"       // the receiver's group acknowledged the entry
	StateUndelivered = "undelivered" // in the stream, not read by the receiver's group yet
	StateTrimmed     = "trimmed"     // no longer in the stream (acknowledged and trimmed, or lost); at null when no entry id is known
	StateNotFound    = "not_found"   // the outbox row is gone, nothing received it, and no entry or dead letter names one
	StateNotRead     = "not_read"    // Redis was not read (no --redis-url, or an error in Errors): the entry's state is unknown
	// StageReceived.
	StateHeld  = "held"  // stored behind a missing seq: not shown until the gap fills or times out
	StateShown = "shown" // pushed to the room's sockets
)

// DefaultMaxScan is Options.MaxScan's default.
const DefaultMaxScan = 200_000

// streamSkew is how far before the message's stored time (the database
// clock) the stream scan starts: the entries' ids are Redis's clock.
const streamSkew = time.Minute

// Options tune ByID. A zero field means its default.
type Options struct {
	// Prefix is the deployment's Redis key prefix. Default "" (no prefix;
	// pass chat.DefaultRedisPrefix for the services' default).
	Prefix string
	// MaxScan bounds the stream and dead-letter entries read looking for
	// the message's (from its stored time on). Default DefaultMaxScan.
	MaxScan int
}

// Trace is what `outboxchat trace --json` prints.
type Trace struct {
	MessageID string `json:"message_id"`
	// Service sent the message; Receiver is the other one.
	Service  string `json:"service"`
	Receiver string `json:"receiver"`
	ChatID   int64  `json:"chat_id"`
	Seq      int64  `json:"seq"`
	// Partition is the chat's partition (chat.Partition), among as many
	// as the sender's schema has outbox tables (schema.PartitionTables;
	// 0 without partitions): the outbox table and the stream read for the
	// stages below.
	Partition int `json:"partition"`
	// Stages in time order (stages without a time last).
	Stages []Stage `json:"stages"`
	// Errors lists what could not be read ("redis: …"); the stages from
	// there are missing.
	Errors []string `json:"errors,omitempty"`
}

// Stage is one step of the message's way. At is when it got there (null
// when unknown: an entry that was never found). The other fields are set
// where they apply.
type Stage struct {
	Stage string     `json:"stage"`
	At    *time.Time `json:"at"`
	// Service is the service the stage is on.
	Service string `json:"service,omitempty"`
	// State: see the State constants.
	State string `json:"state,omitempty"`
	// Reason: the last publish error (outbox), why it was dead-lettered.
	Reason string `json:"reason,omitempty"`
	// StreamID is the stream entry (published, dead_lettered, received:
	// the entry the inbox row was stored from).
	StreamID string `json:"stream_id,omitempty"`
	// DeadID is the dead-letter entry (`outboxchat deadletters show ID`).
	DeadID string `json:"dead_id,omitempty"`
	// Consumer and Deliveries: the group member holding a pending entry,
	// and how often the entry was handed out.
	Consumer   string `json:"consumer,omitempty"`
	Deliveries int64  `json:"deliveries,omitempty"`
	// Attempts and Failures: the outbox row's failed passes and those
	// blamed on the row.
	Attempts int64 `json:"attempts,omitempty"`
	Failures int64 `json:"failures,omitempty"`
	// Redrives is how often the re-drive published the message again.
	Redrives int64 `json:"redrives,omitempty"`
	// Duplicates is how many copies the receiver's inbox skipped.
	Duplicates int64 `json:"duplicates,omitempty"`
	// UptoSeq is the seq the receipt covered up to.
	UptoSeq int64 `json:"upto_seq,omitempty"`
}

// DB is what Trace reads through: a pool or connection of a role that can
// read both services' schemas (the admin URL of `outboxchat status`).
type DB interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Find returns the id of the message at chat chatID and seq seq of service
// ("" for either; then ErrAmbiguous when both have one). Errors: ErrNotFound,
// ErrAmbiguous, an unknown service, database errors (wrapped).
func Find(ctx context.Context, db DB, service string, chatID, seq int64) (string, error) {
	services := []string{chat.Consumers, chat.Workers}
	if service != "" {
		if err := chat.CheckService(service); err != nil {
			return "", err
		}
		services = []string{service}
	}
	var found []string
	for _, s := range services {
		var id string
		err := db.QueryRow(ctx, `SELECT id::text FROM `+pgx.Identifier{s, "messages"}.Sanitize()+
			` WHERE chat_id = $1 AND seq = $2`, chatID, seq).Scan(&id)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return "", fmt.Errorf("trace: finding chat %d seq %d of %s: %w", chatID, seq, s, err)
		default:
			found = append(found, s+" "+id)
		}
	}
	switch len(found) {
	case 0:
		return "", fmt.Errorf("trace: chat %d seq %d: %w", chatID, seq, ErrNotFound)
	case 1:
		_, id, _ := strings.Cut(found[0], " ")
		return id, nil
	}
	return "", fmt.Errorf("trace: chat %d seq %d: %w (%s): pass --service", chatID, seq, ErrAmbiguous, strings.Join(found, ", "))
}

// ByID traces message id. rdb may be nil (the stream stages are then left
// out, and said so in Errors). Errors: ErrNotFound when neither service
// stored it, an id that is not a UUID (ErrNotFound too), database errors
// (wrapped). Redis errors do not fail it: they go into Trace.Errors.
func ByID(ctx context.Context, db DB, rdb redis.UniversalClient, id string, opt Options) (*Trace, error) {
	if opt.MaxScan <= 0 {
		opt.MaxScan = DefaultMaxScan
	}
	tr := &Trace{MessageID: id}
	var stored, redrivenAt *time.Time
	var redrives int64
	for _, s := range []string{chat.Consumers, chat.Workers} {
		err := db.QueryRow(ctx, `SELECT chat_id, seq, created_at, redrives, redriven_at FROM `+
			pgx.Identifier{s, "messages"}.Sanitize()+` WHERE id::text = $1`, id).
			Scan(&tr.ChatID, &tr.Seq, &stored, &redrives, &redrivenAt)
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("trace: reading message %s of %s: %w", id, s, err)
		}
		tr.Service = s
		break
	}
	if tr.Service == "" {
		return nil, fmt.Errorf("trace: message %q: %w", id, ErrNotFound)
	}
	tr.Receiver = chat.Peer(tr.Service)
	parts, err := schema.PartitionTables(ctx, db, tr.Service)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	tr.Partition = chat.Partition(tr.ChatID, len(parts))
	tr.add(Stage{Stage: StageStored, At: stored, Service: tr.Service})
	if redrives > 0 {
		tr.add(Stage{Stage: StageRedriven, At: redrivenAt, Service: tr.Service, Redrives: redrives})
	}
	inOutbox, err := tr.outbox(ctx, db)
	if err != nil {
		return nil, err
	}
	received, err := tr.received(ctx, db)
	if err != nil {
		return nil, err
	}
	if err := tr.delivered(ctx, db); err != nil {
		return nil, err
	}
	entries := map[string]*Stage{} // stream id → its published stage
	if received != "" {
		entries[received] = nil
	}
	streamRead := false
	if rdb == nil {
		tr.Errors = append(tr.Errors, "redis: no --redis-url (or REDIS_URL): stream entries and dead letters not read")
	} else if err := tr.stream(ctx, rdb, opt, stored.Add(-streamSkew), entries); err != nil {
		tr.Errors = append(tr.Errors, "redis: "+err.Error())
	} else {
		streamRead = true
	}
	// An entry the inbox names and the stream read did not find is
	// trimmed; with the stream not read, whether it is is not known.
	unseen := StateTrimmed
	if !streamRead {
		unseen = StateNotRead
	}
	for sid, st := range entries {
		if st == nil {
			st = &Stage{Stage: StagePublished, At: streamTime(sid), Service: tr.Service, StreamID: sid, State: unseen}
		}
		tr.add(*st)
	}
	if !inOutbox && len(entries) == 0 {
		// Published (the row is gone), but no entry is left to say when:
		// trimmed after the receiver stored it (a row stored before
		// migration 011 does not name its entry), or lost before; or
		// Redis, which would say, was not read.
		st := Stage{Stage: StagePublished, Service: tr.Service, State: StateNotFound}
		switch {
		case !streamRead:
			st.State = StateNotRead
		case received != "" || tr.has(StageReceived):
			st.State = StateTrimmed
		}
		tr.add(st)
	}
	tr.sort()
	return tr, nil
}

func (tr *Trace) add(s Stage) { tr.Stages = append(tr.Stages, s) }

func (tr *Trace) has(stage string) bool {
	for _, s := range tr.Stages {
		if s.Stage == stage {
			return true
		}
	}
	return false
}

// order ranks the stages of equal times in the order of the way.
var order = map[string]int{StageStored: 0, StageOutbox: 1, StagePublished: 2, StageDeadLettered: 3,
	StageRedriven: 4, StageReceived: 5, StageDelivered: 6}

func (tr *Trace) sort() {
	sort.SliceStable(tr.Stages, func(i, j int) bool {
		a, b := tr.Stages[i], tr.Stages[j]
		switch {
		case a.At == nil || b.At == nil:
			return a.At != nil && b.At == nil
		case !a.At.Equal(*b.At):
			return a.At.Before(*b.At)
		}
		return order[a.Stage] < order[b.Stage]
	})
}

// outbox adds the sender's outbox row, if the relay has not published it
// yet (published rows are deleted), and reports whether there is one.
func (tr *Trace) outbox(ctx context.Context, db DB) (bool, error) {
	var created time.Time
	var parked *time.Time
	var attempts, failures int64
	var lastErr *string
	table := chat.OutboxTable(tr.Service, tr.Partition)
	err := db.QueryRow(ctx, `SELECT created_at, parked_at, attempts, failures, last_error FROM `+
		pgx.Identifier(strings.Split(table, ".")).Sanitize()+
		` WHERE idempotency_key = $1 AND sent_at IS NULL ORDER BY id LIMIT 1`, tr.MessageID).
		Scan(&created, &parked, &attempts, &failures, &lastErr)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("trace: reading %s: %w", table, err)
	}
	st := Stage{Stage: StageOutbox, At: &created, Service: tr.Service, State: StatePending, Attempts: attempts, Failures: failures}
	if lastErr != nil {
		st.Reason = *lastErr
	}
	if parked != nil {
		st.State, st.At = StateParked, parked
	}
	tr.add(st)
	return true, nil
}

// received adds the receiver's inbox row, if any, and returns the stream
// entry it was stored from ("" if unknown).
func (tr *Trace) received(ctx context.Context, db DB) (string, error) {
	s := tr.Receiver
	var at time.Time
	var held, filled bool
	var streamID *string
	var dups int64
	err := db.QueryRow(ctx, `SELECT i.received_at, i.held, i.stream_id,
			EXISTS (SELECT 1 FROM `+pgx.Identifier{s, "inbox_gap_fills"}.Sanitize()+` g WHERE g.chat_id = i.chat_id AND g.upto >= i.seq),
			(SELECT count(*) FROM `+pgx.Identifier{s, "inbox_duplicates"}.Sanitize()+` d WHERE d.message_id = i.message_id)
		FROM `+pgx.Identifier{s, "inbox"}.Sanitize()+` i WHERE i.message_id::text = $1`, tr.MessageID).
		Scan(&at, &held, &streamID, &filled, &dups)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("trace: reading %s.inbox: %w", s, err)
	}
	st := Stage{Stage: StageReceived, At: &at, Service: s, State: StateShown, Duplicates: dups}
	if held && !filled {
		st.State = StateHeld
	}
	if streamID != nil {
		st.StreamID = *streamID
	}
	tr.add(st)
	return st.StreamID, nil
}

// delivered adds the sender's first receipt covering the message.
func (tr *Trace) delivered(ctx context.Context, db DB) error {
	var at time.Time
	var upto int64
	err := db.QueryRow(ctx, `SELECT delivered_at, upto_seq FROM `+pgx.Identifier{tr.Service, "receipts"}.Sanitize()+
		` WHERE chat_id = $1 AND upto_seq >= $2 ORDER BY upto_seq LIMIT 1`, tr.ChatID, tr.Seq).Scan(&at, &upto)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("trace: reading %s.receipts: %w", tr.Service, err)
	}
	tr.add(Stage{Stage: StageDelivered, At: &at, Service: tr.Service, UptoSeq: upto})
	return nil
}

// stream reads the stream the sender publishes to and its dead letters
// from since on (at most opt.MaxScan entries each), adds a dead_lettered
// stage for each dead letter of the message and fills entries with a
// published stage for each stream entry of it (and for the entries the
// dead letters and the inbox row name, which may be gone).
func (tr *Trace) stream(ctx context.Context, rdb redis.UniversalClient, opt Options, since time.Time, entries map[string]*Stage) error {
	keys := redisq.NewKeys(opt.Prefix, chat.PartitionQueue(tr.Service, tr.Partition))
	start := strconv.FormatInt(max(since.UnixMilli(), 0), 10)
	err := scan(ctx, rdb, keys.Dead, start, opt.MaxScan, func(m redis.XMessage) {
		if str(m, "id") != tr.MessageID {
			return
		}
		sid := str(m, "stream_id")
		tr.add(Stage{Stage: StageDeadLettered, At: streamTime(m.ID), Service: tr.Receiver, Reason: str(m, "reason"),
			StreamID: sid, DeadID: m.ID})
		if _, ok := entries[sid]; sid != "" && !ok {
			entries[sid] = nil
		}
	})
	if err != nil {
		return fmt.Errorf("reading dead letters: %w", err)
	}
	var found []string
	err = scan(ctx, rdb, keys.Stream, start, opt.MaxScan, func(m redis.XMessage) {
		if str(m, "id") == tr.MessageID {
			found = append(found, m.ID)
		}
	})
	if err != nil {
		return fmt.Errorf("reading the stream: %w", err)
	}
	if len(found) == 0 {
		return nil
	}
	group := tr.Receiver
	var lastDelivered string
	groups, err := rdb.XInfoGroups(ctx, keys.Stream).Result()
	if err != nil && !redis.HasErrorPrefix(err, "ERR no such key") {
		return fmt.Errorf("reading the consumer groups: %w", err)
	}
	for _, g := range groups {
		if g.Name == group {
			lastDelivered = g.LastDeliveredID
		}
	}
	for _, sid := range found {
		st := &Stage{Stage: StagePublished, At: streamTime(sid), Service: tr.Service, StreamID: sid, State: StateAcked}
		if lastDelivered == "" || streamLess(lastDelivered, sid) {
			st.State = StateUndelivered
		} else {
			p, err := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: keys.Stream, Group: group, Start: sid, End: sid, Count: 1}).Result()
			if err != nil && !redis.HasErrorPrefix(err, "NOGROUP") {
				return fmt.Errorf("reading pending entries: %w", err)
			}
			if len(p) == 1 {
				st.State, st.Consumer, st.Deliveries = StatePending, p[0].Consumer, p[0].RetryCount
			}
		}
		entries[sid] = st
	}
	return nil
}

// scan calls f for each entry of stream from start ("ms" or an id) on, at
// most limit entries, a page at a time.
func scan(ctx context.Context, rdb redis.UniversalClient, stream, start string, limit int, f func(redis.XMessage)) error {
	const page = 1000
	for n := 0; n < limit; {
		ms, err := rdb.XRangeN(ctx, stream, start, "+", page).Result()
		if err != nil {
			return err
		}
		for _, m := range ms {
			f(m)
		}
		n += len(ms)
		if len(ms) < page {
			return nil
		}
		start = "(" + ms[len(ms)-1].ID
	}
	return nil
}

func str(m redis.XMessage, k string) string { s, _ := m.Values[k].(string); return s }

// streamTime is the time in an entry id "ms-seq" (nil if it has none).
func streamTime(id string) *time.Time {
	ms, _, _ := strings.Cut(id, "-")
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil || n <= 0 {
		return nil
	}
	t := time.UnixMilli(n).UTC()
	return &t
}

// streamLess reports whether entry id a is before b.
func streamLess(a, b string) bool {
	am, as := splitID(a)
	bm, bs := splitID(b)
	return am < bm || am == bm && as < bs
}

func splitID(id string) (int64, int64) {
	m, s, _ := strings.Cut(id, "-")
	mi, _ := strconv.ParseInt(m, 10, 64)
	si, _ := strconv.ParseInt(s, 10, 64)
	return mi, si
}
