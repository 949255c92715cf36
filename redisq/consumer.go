package redisq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Consumer defaults.
const (
	// DefaultBlock is ConsumerConfig.Block's default: how long one Fetch
	// waits for new entries (XREADGROUP BLOCK).
	DefaultBlock = time.Second
	// DefaultLockDuration is ConsumerConfig.LockDuration's default: how long
	// a delivery may stay unacknowledged before another consumer reclaims it.
	DefaultLockDuration = 30 * time.Second
	// DefaultTrimInterval is ConsumerConfig.TrimInterval's default: the
	// least time between two trims of acknowledged entries.
	DefaultTrimInterval = time.Second
	// DefaultDeadLetterMax is ConsumerConfig.DeadLetterMax's default: the
	// most entries the dead-letter stream keeps.
	DefaultDeadLetterMax = 100_000
)

// trimBatch is the most entries one trim call deletes (with their dedupe
// marks), so a call stays short even after a long pause.
const trimBatch = 10000

// maxClaimRounds bounds the XAUTOCLAIM calls one Fetch makes while scanning
// a long pending list for stalled entries (each call scans up to 10×max).
const maxClaimRounds = 4

// ErrMalformedEntry is wrapped by Delivery.Err for a stream entry that lacks
// the id, name or payload field, or whose headers field does not decode
// (written by something other than Add).
var ErrMalformedEntry = errors.New("redisq: malformed stream entry")

// ConsumerConfig configures a Consumer. Queue, Group and Consumer are
// required; zero durations take their defaults.
type ConsumerConfig struct {
	// Queue names the queue (required; no "{" or "}"; must match the
	// PublisherConfig's).
	Queue string
	// Prefix is prepended to every key (default ""; must match the
	// PublisherConfig's).
	Prefix string
	// Group is the consumer group (required). Every group gets every entry;
	// the consumers of one group share them.
	Group string
	// Consumer is this consumer's name within Group (required). Two live
	// processes must not share one (they would share its pending list).
	// The application picks it: the chat's package chat/presence claims
	// one no live process holds and that a replacement of a stopped
	// process gets again, so it finds and finishes the pending entries
	// left under it first.
	Consumer string
	// Block is how long Fetch waits for new entries (XREADGROUP BLOCK,
	// millisecond resolution; default DefaultBlock). It is also the longest
	// Fetch takes to notice that ctx was cancelled.
	Block time.Duration
	// LockDuration is how long an entry may stay pending (delivered, not
	// acknowledged) on any consumer before Fetch reclaims it with XAUTOCLAIM
	// (millisecond resolution; default DefaultLockDuration), so a job whose
	// worker died is handed out again after at most this long. Keep it above the longest time a batch takes to process,
	// or entries still being processed are handed out twice.
	LockDuration time.Duration
	// ClaimInterval is the least time between two scans for stalled entries
	// (default LockDuration/2).
	ClaimInterval time.Duration
	// TrimInterval is the least time between two trims of acknowledged
	// entries, done by Ack and by a Fetch that finds nothing (default
	// DefaultTrimInterval); Trim trims at once.
	TrimInterval time.Duration
	// DeadLetterMax caps the dead-letter stream: DeadLetter trims it to
	// this many entries (the oldest go first, exactly, counted in an
	// EventDeadLetterTrimmed). Default 0 means DefaultDeadLetterMax
	// (100,000); negative means no cap.
	DeadLetterMax int64
	// Logger receives warnings and debug logs (default slog.Default()).
	Logger *slog.Logger
	// OnEvent, when set, receives every typed Event of the Consumer. It
	// must be safe for concurrent use and must not block. Default nil.
	OnEvent func(Event)
}

// Consumer reads one queue as one member of a consumer group.
//
// Fetch must be called by one goroutine at a time (it keeps a read cursor);
// Ack, DeadLetter and Stats are safe to call concurrently with it and with
// each other. A Consumer runs no goroutines and needs no Start or Stop; the
// caller keeps owning rdb.
type Consumer struct {
	rdb    redis.UniversalClient
	keys   Keys
	queue  string
	group  string
	name   string
	block  time.Duration
	lock   time.Duration
	claimI time.Duration
	trimI  time.Duration
	dlMax  int64
	logger *slog.Logger
	on     func(Event)

	mu sync.Mutex // guards the fields below
	// groupReady is set once XGROUP CREATE succeeded or found the group.
	groupReady bool
	// drained is set once this consumer's own pending list has been read
	// through (from cursor) without finding anything.
	drained bool
	// cursor is the last own-pending id returned while draining.
	cursor string
	// outstanding holds the stream ids handed out by Fetch and not yet
	// acknowledged or dead-lettered by this Consumer.
	outstanding map[string]struct{}
	// claimCursor is where the next XAUTOCLAIM scan continues ("0-0": start).
	claimCursor string
	// lastClaim is when the last complete XAUTOCLAIM scan ended.
	lastClaim time.Time
	// lastTrim is when the trim script last ran; acked is set by Ack and
	// cleared by a trim.
	lastTrim time.Time
	acked    bool

	// deleted counts pending entries found deleted from the stream.
	deleted atomic.Int64
}

// WithDefaults returns a copy of c in which every zero field holds its
// default: Block DefaultBlock, LockDuration DefaultLockDuration,
// ClaimInterval LockDuration/2, TrimInterval DefaultTrimInterval, Logger
// slog.Default(). Values it keeps are checked by NewConsumer. A nil c gives
// a config of defaults without Queue, Group and Consumer.
func (c *ConsumerConfig) WithDefaults() *ConsumerConfig {
	d := *cmp.Or(c, &ConsumerConfig{})
	d.Block = cmp.Or(d.Block, DefaultBlock)
	d.LockDuration = cmp.Or(d.LockDuration, DefaultLockDuration)
	d.ClaimInterval = cmp.Or(d.ClaimInterval, d.LockDuration/2)
	d.TrimInterval = cmp.Or(d.TrimInterval, DefaultTrimInterval)
	d.DeadLetterMax = cmp.Or(d.DeadLetterMax, DefaultDeadLetterMax)
	d.Logger = cmp.Or(d.Logger, slog.Default())
	return &d
}

// validate checks a config that went through WithDefaults. Errors wrap
// ErrInvalidConfig.
func (c *ConsumerConfig) validate() error {
	if c.Queue == "" || c.Group == "" || c.Consumer == "" {
		return fmt.Errorf("config: Queue, Group and Consumer are required: %w", ErrInvalidConfig)
	}
	if err := checkQueueName(c.Queue); err != nil {
		return err
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"Block", c.Block},
		{"LockDuration", c.LockDuration},
		{"ClaimInterval", c.ClaimInterval},
		{"TrimInterval", c.TrimInterval},
	} {
		if d.v < time.Millisecond {
			return fmt.Errorf("%s %v below 1ms: %w", d.name, d.v, ErrInvalidConfig)
		}
	}
	return nil
}

// NewConsumer returns a Consumer of cfg.Group named cfg.Consumer on
// cfg.Queue through rdb (use NewClient for a fail-fast client). It does not
// touch Redis: the group is created by the first Fetch. Errors wrap
// ErrInvalidConfig: nil rdb or cfg, missing Queue, Group or Consumer, or a
// negative or sub-millisecond duration (after ConsumerConfig.WithDefaults).
func NewConsumer(rdb redis.UniversalClient, cfg *ConsumerConfig) (*Consumer, error) {
	if rdb == nil {
		return nil, fmt.Errorf("redisq: new consumer: nil redis client: %w", ErrInvalidConfig)
	}
	if cfg == nil {
		return nil, fmt.Errorf("redisq: new consumer: Queue, Group and Consumer are required: %w", ErrInvalidConfig)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("redisq: new consumer: %w", err)
	}
	return &Consumer{
		rdb:         rdb,
		keys:        NewKeys(cfg.Prefix, cfg.Queue),
		queue:       cfg.Queue,
		group:       cfg.Group,
		name:        cfg.Consumer,
		block:       cfg.Block,
		lock:        cfg.LockDuration,
		claimI:      cfg.ClaimInterval,
		trimI:       cfg.TrimInterval,
		dlMax:       cfg.DeadLetterMax,
		logger:      cfg.Logger.With("component", "redisq", "queue", cfg.Queue, "group", cfg.Group, "consumer", cfg.Consumer),
		on:          cfg.OnEvent,
		cursor:      "0",
		outstanding: map[string]struct{}{},
		claimCursor: "0-0",
		lastTrim:    time.Now(),
	}, nil
}

// Keys returns the queue's key names.
func (c *Consumer) Keys() Keys { return c.keys }

// Fetch returns up to max deliveries (max >= 1), in this order of
// preference:
//
//  1. this consumer's own pending entries (XREADGROUP ... 0): those left by
//     a previous run under the same Consumer name, and those an earlier Fetch
//     of this Consumer returned that were neither acknowledged nor
//     dead-lettered since (they are handed out again, so a batch the caller
//     failed to process is retried first);
//  2. entries pending on any consumer for longer than LockDuration, taken
//     over with XAUTOCLAIM (scanned at most every ClaimInterval);
//  3. new entries (XREADGROUP ... COUNT max BLOCK Block ">").
//
// It returns (nil, nil) when no entry arrived within Block (or before ctx's
// deadline, whichever is sooner). The first call creates the group at "0"
// with MKSTREAM if it does not exist, so entries added before any consumer
// started are delivered too; the group is created again if it vanished
// (e.g. Redis restarted without AOF).
//
// An entry whose fields are missing is still returned, with the fields that
// could be read and Err wrapping ErrMalformedEntry, so the caller can
// dead-letter it. Entries deleted from the stream while pending are
// acknowledged away and not returned. Within each source entries come in
// stream order. Errors: invalid max, ctx done, any Redis error (wrapped); a
// failed Fetch hands nothing out.
func (c *Consumer) Fetch(ctx context.Context, max int) ([]Delivery, error) {
	if max < 1 {
		return nil, fmt.Errorf("redisq: fetching: max %d must be at least 1", max)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("redisq: fetching: %w", err)
	}
	ds, err := c.fetch(ctx, max)
	if err == nil && len(ds) == 0 {
		// Idle: trim what the last Acks left, so a drained queue gives its
		// memory back without waiting for the next Ack.
		c.trimIfDue(ctx)
	}
	if redis.HasErrorPrefix(err, "NOGROUP") {
		c.noteNoGroup(ctx, err)
		ds, err = c.fetch(ctx, max)
	}
	if err != nil {
		// Entries may have been delivered to us without reaching the
		// caller: look at the pending list again next time.
		c.mu.Lock()
		c.drained = false
		c.cursor = "0"
		c.mu.Unlock()
		return nil, fmt.Errorf("redisq: fetching: %w", err)
	}
	c.mu.Lock()
	for _, d := range ds {
		c.outstanding[d.StreamID] = struct{}{}
	}
	c.mu.Unlock()
	return ds, nil
}

func (c *Consumer) fetch(ctx context.Context, max int) ([]Delivery, error) {
	if err := c.ensureGroup(ctx); err != nil {
		return nil, err
	}
	ds, err := c.fetchOwnPending(ctx, max)
	if err != nil || len(ds) > 0 {
		return ds, err
	}
	ds, err = c.fetchStalled(ctx, max)
	if err != nil || len(ds) > 0 {
		return ds, err
	}
	return c.fetchNew(ctx, max)
}

func (c *Consumer) ensureGroup(ctx context.Context) error {
	c.mu.Lock()
	ready := c.groupReady
	c.mu.Unlock()
	if ready {
		return nil
	}
	err := c.rdb.XGroupCreateMkStream(ctx, c.keys.Stream, c.group, "0").Err()
	if err != nil && !redis.HasErrorPrefix(err, "BUSYGROUP") {
		return fmt.Errorf("creating consumer group: %w", err)
	}
	c.mu.Lock()
	c.groupReady = true
	// A new group (or a first Fetch) starts with a fresh look at the
	// pending list.
	c.drained = false
	c.cursor = "0"
	c.mu.Unlock()
	return nil
}

// fetchOwnPending reads this consumer's pending list from the cursor.
func (c *Consumer) fetchOwnPending(ctx context.Context, max int) ([]Delivery, error) {
	c.mu.Lock()
	if len(c.outstanding) > 0 {
		// Deliveries handed out and not settled: read the list again
		// from the start, so they are retried before anything new.
		clear(c.outstanding)
		c.drained = false
		c.cursor = "0"
	}
	drained, cursor := c.drained, c.cursor
	c.mu.Unlock()
	for !drained {
		msgs, err := c.readGroup(ctx, cursor, max, -1)
		if err != nil {
			return nil, err
		}
		if len(msgs) == 0 {
			c.mu.Lock()
			c.drained = true
			c.mu.Unlock()
			return nil, nil
		}
		cursor = msgs[len(msgs)-1].ID
		c.mu.Lock()
		c.cursor = cursor
		c.mu.Unlock()
		live, err := c.dropDeleted(ctx, msgs, nil)
		if err != nil {
			return nil, err
		}
		if len(live) > 0 {
			return c.deliveries(ctx, live, true), nil
		}
	}
	return nil, nil
}

// fetchStalled takes over entries idle for longer than LockDuration.
func (c *Consumer) fetchStalled(ctx context.Context, max int) ([]Delivery, error) {
	c.mu.Lock()
	// An unfinished scan continues at once; a new one waits ClaimInterval.
	due := c.claimCursor != "0-0" || time.Since(c.lastClaim) >= c.claimI
	start := c.claimCursor
	c.mu.Unlock()
	if !due {
		return nil, nil
	}
	for round := 0; round < maxClaimRounds; round++ {
		msgs, next, deleted, err := c.rdb.XAutoClaimWithDeleted(ctx, &redis.XAutoClaimArgs{
			Stream:   c.keys.Stream,
			Group:    c.group,
			Consumer: c.name,
			MinIdle:  c.lock,
			Start:    start,
			Count:    int64(max),
		}).Result()
		if err != nil {
			return nil, fmt.Errorf("reclaiming stalled entries: %w", err)
		}
		c.mu.Lock()
		c.claimCursor = next
		if next == "0-0" {
			c.lastClaim = time.Now()
		}
		c.mu.Unlock()
		live, err := c.dropDeleted(ctx, msgs, deleted)
		if err != nil {
			return nil, err
		}
		if len(live) > 0 {
			c.logger.InfoContext(ctx, "reclaimed stalled entries", "count", len(live), "lock_duration", c.lock)
			if c.on != nil {
				c.on(Event{Kind: EventReclaimed, Queue: c.queue, N: int64(len(live))})
			}
			return c.deliveries(ctx, live, true), nil
		}
		if next == "0-0" {
			break
		}
		start = next
	}
	return nil, nil
}

// fetchNew waits up to Block for entries never delivered to the group.
func (c *Consumer) fetchNew(ctx context.Context, max int) ([]Delivery, error) {
	block := c.block
	if deadline, ok := ctx.Deadline(); ok {
		// Leave room for the reply, so a short ctx deadline ends the
		// block cleanly instead of timing out the connection.
		left := time.Until(deadline) - 50*time.Millisecond
		if left < time.Millisecond {
			return nil, nil
		}
		block = min(block, left)
	}
	msgs, err := c.readGroup(ctx, ">", max, block)
	if err != nil {
		return nil, err
	}
	return c.deliveries(ctx, msgs, false), nil
}

// readGroup runs XREADGROUP from id; block < 0 omits BLOCK. A timed-out
// block yields no messages and no error.
func (c *Consumer) readGroup(ctx context.Context, id string, max int, block time.Duration) ([]redis.XMessage, error) {
	streams, err := c.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group:    c.group,
		Consumer: c.name,
		Streams:  []string{c.keys.Stream, id},
		Count:    int64(max),
		Block:    block,
	}).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading group from %s: %w", id, err)
	}
	if len(streams) == 0 {
		return nil, nil
	}
	return streams[0].Messages, nil
}

// dropDeleted acknowledges entries that are pending but no longer in the
// stream (nil fields, or listed by XAUTOCLAIM as deleted: Redis 7's third
// reply element) and returns the others. Such an entry was lost inside
// Redis (XDEL, a trim, a failover to a replica that lacked it): each is
// logged with its stream id and counted (DeletedPending). Its job id (the
// message id) went with the entry, so it cannot be named here; the
// sender's re-drive names it when it publishes the job again.
func (c *Consumer) dropDeleted(ctx context.Context, msgs []redis.XMessage, deleted []string) ([]redis.XMessage, error) {
	live := msgs[:0:0]
	gone := append([]string(nil), deleted...)
	for _, m := range msgs {
		if m.Values == nil {
			gone = append(gone, m.ID)
			continue
		}
		live = append(live, m)
	}
	if len(gone) > 0 {
		if err := c.rdb.XAck(ctx, c.keys.Stream, c.group, gone...).Err(); err != nil {
			return nil, fmt.Errorf("acknowledging deleted entries: %w", err)
		}
		c.deleted.Add(int64(len(gone)))
		for _, id := range gone {
			c.logger.WarnContext(ctx, "pending entry was deleted from the stream: its job is lost in Redis until the sender re-drives it",
				"stream_id", id)
		}
		if c.on != nil {
			c.on(Event{Kind: EventDeletedPending, Queue: c.queue, N: int64(len(gone)), StreamIDs: gone})
		}
	}
	return live, nil
}

// DeletedPending returns how many pending entries this Consumer found
// deleted from the stream and acknowledged away (see Fetch). Safe for
// concurrent use.
func (c *Consumer) DeletedPending() int64 { return c.deleted.Load() }

// noteNoGroup makes the next Fetch create the group again (at "0", never
// "$": entries already in the stream are delivered) when err is Redis's
// NOGROUP (the stream or its group vanished: FLUSHALL, a restart without
// the AOF, a failover to a replica that lacked them).
func (c *Consumer) noteNoGroup(ctx context.Context, err error) {
	if !redis.HasErrorPrefix(err, "NOGROUP") {
		return
	}
	c.mu.Lock()
	c.groupReady = false
	c.mu.Unlock()
	c.logger.WarnContext(ctx, "consumer group vanished; the next fetch creates it again from 0", "err", err)
	if c.on != nil {
		c.on(Event{Kind: EventGroupLost, Queue: c.queue, Err: err})
	}
}

// deliveries converts msgs. For redelivered entries it looks up the
// delivery counts (XPENDING); if that fails they are left at 1.
func (c *Consumer) deliveries(ctx context.Context, msgs []redis.XMessage, redelivered bool) []Delivery {
	if len(msgs) == 0 {
		return nil
	}
	ds := make([]Delivery, len(msgs))
	for i, m := range msgs {
		ds[i] = decodeEntry(m.ID, m.Values)
	}
	if !redelivered {
		return ds
	}
	pending, err := c.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{
		Stream:   c.keys.Stream,
		Group:    c.group,
		Consumer: c.name,
		Start:    msgs[0].ID,
		End:      msgs[len(msgs)-1].ID,
		Count:    int64(len(msgs)) + 1000,
	}).Result()
	if err != nil {
		c.logger.DebugContext(ctx, "could not read delivery counts", "err", err)
		return ds
	}
	counts := make(map[string]int64, len(pending))
	for _, p := range pending {
		counts[p.ID] = p.RetryCount
	}
	for i := range ds {
		if n, ok := counts[ds[i].StreamID]; ok {
			ds[i].Deliveries = n
		}
	}
	return ds
}

// decodeEntry turns one stream entry's fields into a Delivery. It never
// fails: a missing or non-string field leaves that part empty and sets Err.
func decodeEntry(streamID string, values map[string]any) Delivery {
	d := Delivery{StreamID: streamID, Deliveries: 1}
	var missing []string
	field := func(name string) (string, bool) {
		v, ok := values[name]
		if !ok {
			missing = append(missing, name)
			return "", false
		}
		s, ok := v.(string)
		if !ok {
			missing = append(missing, name)
			return "", false
		}
		return s, true
	}
	d.ID, _ = field("id")
	d.Name, _ = field("name")
	if p, ok := field("payload"); ok {
		d.Payload = []byte(p)
	}
	if s, ok := values["sig"].(string); ok {
		d.Sig = s // optional: absent on unsigned entries
	}
	var badHeaders error
	if v, ok := values[headersField]; ok { // optional: absent without headers
		if s, ok := v.(string); ok {
			d.Headers, badHeaders = decodeHeaders(s)
		} else {
			badHeaders = fmt.Errorf("%w: not a string", errBadHeaders)
		}
	}
	if d.ID == "" && len(missing) == 0 {
		missing = append(missing, "id")
	}
	switch {
	case len(missing) > 0:
		d.Err = fmt.Errorf("%w %s: missing or empty fields %v", ErrMalformedEntry, streamID, missing)
	case badHeaders != nil:
		d.Err = fmt.Errorf("%w %s: %w", ErrMalformedEntry, streamID, badHeaders)
	}
	return d
}

// Ack acknowledges streamIDs for the group (XACK): they will not be
// delivered again. Unknown or already acknowledged ids are ignored; no ids is
// a no-op. At most every TrimInterval it then trims entries every group has
// acknowledged (scripts/trim.lua); a failed trim is logged, not returned,
// and retried by a later Ack. Errors: Redis errors, wrapped; after an error
// the entries may or may not be acknowledged (an unacknowledged one is
// delivered again). Safe for concurrent use.
func (c *Consumer) Ack(ctx context.Context, streamIDs ...string) error {
	if len(streamIDs) == 0 {
		return nil
	}
	if err := c.rdb.XAck(ctx, c.keys.Stream, c.group, streamIDs...).Err(); err != nil {
		c.noteNoGroup(ctx, err)
		return fmt.Errorf("redisq: acknowledging %d entries: %w", len(streamIDs), err)
	}
	c.settled(streamIDs...)
	c.mu.Lock()
	c.acked = true
	c.mu.Unlock()
	c.trimIfDue(ctx)
	return nil
}

// trimIfDue trims when something was acknowledged since the last trim and
// TrimInterval has passed. A failed trim is logged; a later call retries.
// With ctx already done (a Fetch cut short by its caller's stop) it leaves
// the trim for a later call: it could only fail, and the warning would
// appear on every graceful stop. A trim that fails because ctx ended during
// it is logged at debug level, for the same reason.
func (c *Consumer) trimIfDue(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	c.mu.Lock()
	due := c.acked && time.Since(c.lastTrim) >= c.trimI
	if due {
		c.lastTrim = time.Now()
		c.acked = false
	}
	c.mu.Unlock()
	if !due {
		return
	}
	n, err := c.Trim(ctx)
	if err != nil {
		if ctx.Err() != nil {
			c.logger.DebugContext(ctx, "trim cut short by the caller's context; a later call retries", "err", err)
		} else {
			c.logger.WarnContext(ctx, "trimming acknowledged entries failed", "err", err)
		}
		c.mu.Lock()
		c.acked = true
		c.mu.Unlock()
		return
	}
	if n == trimBatch {
		c.mu.Lock()
		c.acked = true // more to trim
		c.mu.Unlock()
	}
}

// Trim deletes the entries every consumer group of the stream has
// acknowledged, with their dedupe marks, and the marks that expired
// (scripts/trim.lua, one call), at most 10,000 of each per call, and
// returns how many entries it deleted. Ack and an idle Fetch call it at most every TrimInterval; call it directly to force
// a trim. During a cluster slot migration of the queue it retries TRYAGAIN
// (TryAgainBudget, within ctx). Safe for concurrent use.
func (c *Consumer) Trim(ctx context.Context) (int64, error) {
	var n int64
	err := retryTryAgain(ctx, func() (err error) {
		n, err = trimScript.Run(ctx, c.rdb, []string{c.keys.Stream, c.keys.Dedupe, c.keys.DedupeTokens}, trimBatch).Int64()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("redisq: trimming stream: %w", err)
	}
	if n > 0 && c.on != nil {
		c.on(Event{Kind: EventTrimmed, Queue: c.queue, N: n})
	}
	return n, nil
}

func (c *Consumer) settled(ids ...string) {
	c.mu.Lock()
	for _, id := range ids {
		delete(c.outstanding, id)
	}
	c.mu.Unlock()
}

// DeadLetter moves d out of the way: in one MULTI/EXEC it XADDs d to the
// dead-letter stream (Keys().Dead) with fields id, name, payload, [sig,]
// [headers,] reason and stream_id, acknowledges d.StreamID, and trims the dead-letter
// stream to DeadLetterMax entries (oldest first; EventDeadLetterTrimmed
// counts them). Use it for entries that can
// never be processed as they are (malformed, poison, forged); operators
// inspect, replay and drop them with DeadLetters. The sig field keeps the
// entry's signature, so a replay is accepted by a receiver that checks
// signatures. During a cluster slot migration of the queue it retries
// TRYAGAIN (TryAgainBudget, within ctx).
//
// An entry no longer pending in the group is left alone (nil, logged at
// Info): another consumer settled it, after taking it over at the end of
// the lock duration while this one still held a copy (a batch retried
// while Postgres was down, say). Without that check both would
// dead-letter it, and the dead-letter stream would hold it twice. The check
// is a read before the MULTI: a takeover between the two can still
// dead-letter an entry twice (both copies say the same).
//
// Errors: empty d.StreamID, Redis errors (wrapped; then none of the steps
// happened). Safe for concurrent use. DeadLetterPending also says whether
// the entry was moved.
func (c *Consumer) DeadLetter(ctx context.Context, d Delivery, reason string) error {
	_, err := c.DeadLetterPending(ctx, d, reason)
	return err
}

// DeadLetterPending is DeadLetter, and reports whether it moved the entry:
// false with a nil error when the entry was no longer pending in the group
// (another consumer settled it; nothing was done). The inbox adapter
// (InboxSource) turns that false into inbox.ErrSettled, so the inbox does
// not count a dead letter it did not make. Errors and concurrency as
// DeadLetter.
func (c *Consumer) DeadLetterPending(ctx context.Context, d Delivery, reason string) (moved bool, err error) {
	if d.StreamID == "" {
		return false, fmt.Errorf("redisq: dead-lettering: empty stream id")
	}
	pend, err := c.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{
		Stream: c.keys.Stream, Group: c.group, Start: d.StreamID, End: d.StreamID, Count: 1}).Result()
	if err != nil {
		c.noteNoGroup(ctx, err)
		return false, fmt.Errorf("redisq: dead-lettering %s: %w", d.StreamID, err)
	}
	if len(pend) == 0 {
		c.settled(d.StreamID)
		c.logger.InfoContext(ctx, "entry to dead-letter already settled by another consumer; left alone",
			"stream_id", d.StreamID, "message_id", d.ID)
		return false, nil
	}
	var trim *redis.IntCmd
	// A MULTI whose keys are split between two nodes during a slot
	// migration gets TRYAGAIN and runs none of its commands.
	err = retryTryAgain(ctx, func() error {
		_, err := c.rdb.TxPipelined(ctx, c.deadLetterTx(ctx, d, reason, &trim))
		return err
	})
	if err != nil {
		c.noteNoGroup(ctx, err)
		return false, fmt.Errorf("redisq: dead-lettering %s: %w", d.StreamID, err)
	}
	c.settled(d.StreamID)
	c.logger.WarnContext(ctx, "dead-lettered entry", "stream_id", d.StreamID, "message_id", d.ID, "reason", reason)
	if trim != nil {
		if n := trim.Val(); n > 0 {
			if c.on != nil {
				c.on(Event{Kind: EventDeadLetterTrimmed, Queue: c.queue, N: n})
			}
			c.logger.WarnContext(ctx, "dead-letter stream full: oldest entries dropped", "dropped", n, "max", c.dlMax)
		}
	}
	return true, nil
}

// Stats is a snapshot of a queue's size.
type Stats struct {
	// StreamLen is the number of entries in the stream (XLEN): pending,
	// undelivered and acknowledged-but-not-yet-trimmed ones.
	StreamLen int64
	// Pending is the number of entries delivered to the group and not yet
	// acknowledged (XPENDING); 0 if the group does not exist yet.
	Pending int64
	// DeadLetters is the number of entries in the dead-letter stream.
	DeadLetters int64
}

// Stats reads the queue's sizes in one round trip. Errors: Redis errors,
// wrapped. Safe for concurrent use.
func (c *Consumer) Stats(ctx context.Context) (Stats, error) {
	pipe := c.rdb.Pipeline()
	xlen := pipe.XLen(ctx, c.keys.Stream)
	pending := pipe.XPending(ctx, c.keys.Stream, c.group)
	dead := pipe.XLen(ctx, c.keys.Dead)
	_, _ = pipe.Exec(ctx)
	var s Stats
	var err error
	if s.StreamLen, err = xlen.Result(); err != nil {
		return Stats{}, fmt.Errorf("redisq: reading stats: %w", err)
	}
	if p, err := pending.Result(); err == nil {
		s.Pending = p.Count
	} else if !redis.HasErrorPrefix(err, "NOGROUP") {
		return Stats{}, fmt.Errorf("redisq: reading stats: %w", err)
	}
	if s.DeadLetters, err = dead.Result(); err != nil {
		return Stats{}, fmt.Errorf("redisq: reading stats: %w", err)
	}
	return s, nil
}

// deadLetterTx queues DeadLetter's commands for d on a MULTI pipeline; the
// dead-letter trim's command goes to *trim (nil when DeadLetterMax is 0).
func (c *Consumer) deadLetterTx(ctx context.Context, d Delivery, reason string, trim **redis.IntCmd) func(redis.Pipeliner) error {
	return func(pipe redis.Pipeliner) error {
		vals := []any{"id", d.ID, "name", d.Name, "payload", d.Payload}
		if d.Sig != "" {
			vals = append(vals, "sig", d.Sig)
		}
		if h := encodeHeaders(d.Headers); h != "" {
			vals = append(vals, headersField, h)
		}
		pipe.XAdd(ctx, &redis.XAddArgs{
			Stream: c.keys.Dead,
			Values: append(vals, "reason", reason, "stream_id", d.StreamID),
		})
		pipe.XAck(ctx, c.keys.Stream, c.group, d.StreamID)
		if c.dlMax > 0 {
			*trim = pipe.XTrimMaxLen(ctx, c.keys.Dead, c.dlMax)
		}
		return nil
	}
}
