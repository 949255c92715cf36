package redisq

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/internal/deadletter"
	"github.com/outboxchat/outboxchat/internal/queuescript"
	"github.com/outboxchat/outboxchat/internal/streamentry"
	"github.com/outboxchat/outboxchat/internal/streamgroup"
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

// ErrMalformedEntry is wrapped by Delivery.Err for a stream entry that lacks
// the id, name or payload field, or whose headers field does not decode
// (written by something other than Add).
var ErrMalformedEntry = streamentry.ErrMalformed

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

	// read hands out the entries of the group (Fetch).
	read *streamgroup.Reader
	// dead is the queue's dead-letter stream (DeadLetter).
	dead deadletter.Stream

	mu sync.Mutex // guards the fields below
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
	c := &Consumer{
		rdb:      rdb,
		keys:     NewKeys(cfg.Prefix, cfg.Queue),
		queue:    cfg.Queue,
		group:    cfg.Group,
		name:     cfg.Consumer,
		block:    cfg.Block,
		lock:     cfg.LockDuration,
		claimI:   cfg.ClaimInterval,
		trimI:    cfg.TrimInterval,
		dlMax:    cfg.DeadLetterMax,
		logger:   cfg.Logger.With("component", "redisq", "queue", cfg.Queue, "group", cfg.Group, "consumer", cfg.Consumer),
		on:       cfg.OnEvent,
		lastTrim: time.Now(),
	}
	c.dead = deadletter.Stream{RDB: rdb, Stream: c.keys.Stream, Dead: c.keys.Dead, Dedupe: c.keys.Dedupe, TryAgain: tryAgainBudget}
	c.read = streamgroup.New(rdb, streamgroup.Config{
		Stream: c.keys.Stream, Group: c.group, Consumer: c.name,
		Block: c.block, LockDuration: c.lock, ClaimInterval: c.claimI, Logger: c.logger,
		OnReclaimed: c.reclaimed, OnDeleted: c.deletedPending, OnGroupLost: c.groupLost,
	})
	return c, nil
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
	es, err := c.read.Read(ctx, max)
	if err != nil {
		return nil, fmt.Errorf("redisq: fetching: %w", err)
	}
	if len(es) == 0 {
		// Idle: trim what the last Acks left, so a drained queue gives its
		// memory back without waiting for the next Ack.
		c.trimIfDue(ctx)
		return nil, nil
	}
	ds := make([]Delivery, len(es))
	for i, e := range es {
		ds[i] = decodeEntry(e.ID, e.Values)
		ds[i].Deliveries = e.Deliveries
	}
	return ds, nil
}

// reclaimed logs and tells of n stalled entries a Fetch took over.
func (c *Consumer) reclaimed(ctx context.Context, n int) {
	c.logger.InfoContext(ctx, "reclaimed stalled entries", "count", n, "lock_duration", c.lock)
	if c.on != nil {
		c.on(Event{Kind: EventReclaimed, Queue: c.queue, N: int64(n)})
	}
}

// deletedPending counts, logs and tells of the pending entries a Fetch
// found deleted from the stream and acknowledged away. Such an entry was
// lost inside Redis (XDEL, a trim, a failover to a replica that lacked
// it). Its job id (the message id) went with the entry, so it cannot be
// named here; the sender's re-drive names it when it publishes the job
// again.
func (c *Consumer) deletedPending(ctx context.Context, ids []string) {
	c.deleted.Add(int64(len(ids)))
	for _, id := range ids {
		c.logger.WarnContext(ctx, "pending entry was deleted from the stream: its job is lost in Redis until the sender re-drives it",
			"stream_id", id)
	}
	if c.on != nil {
		c.on(Event{Kind: EventDeletedPending, Queue: c.queue, N: int64(len(ids)), StreamIDs: ids})
	}
}

// DeletedPending returns how many pending entries this Consumer found
// deleted from the stream and acknowledged away (see Fetch). Safe for
// concurrent use.
func (c *Consumer) DeletedPending() int64 { return c.deleted.Load() }

// groupLost logs and tells that the group vanished (NOGROUP); the next
// Fetch creates it again from 0.
func (c *Consumer) groupLost(ctx context.Context, err error) {
	c.logger.WarnContext(ctx, "consumer group vanished; the next fetch creates it again from 0", "err", err)
	if c.on != nil {
		c.on(Event{Kind: EventGroupLost, Queue: c.queue, Err: err})
	}
}

// decodeEntry turns one stream entry's fields into a Delivery. It never
// fails: a missing or non-string field leaves that part empty and sets Err.
func decodeEntry(streamID string, values map[string]any) Delivery {
	f, err := streamentry.Decode(streamID, values)
	return Delivery{Job: Job(f), StreamID: streamID, Deliveries: 1, Err: err}
}

// Ack acknowledges streamIDs for the group (XACK): they will not be
// delivered again. Unknown or already acknowledged ids are ignored; no ids is
// a no-op. At most every TrimInterval it then trims entries every group has
// acknowledged (trim.lua); a failed trim is logged, not returned,
// and retried by a later Ack. Errors: Redis errors, wrapped; after an error
// the entries may or may not be acknowledged (an unacknowledged one is
// delivered again). Safe for concurrent use.
func (c *Consumer) Ack(ctx context.Context, streamIDs ...string) error {
	if len(streamIDs) == 0 {
		return nil
	}
	if err := c.rdb.XAck(ctx, c.keys.Stream, c.group, streamIDs...).Err(); err != nil {
		c.read.NoteNoGroup(ctx, err)
		return fmt.Errorf("redisq: acknowledging %d entries: %w", len(streamIDs), err)
	}
	c.read.Settled(streamIDs...)
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
// (trim.lua, one call), at most 10,000 of each per call, and
// returns how many entries it deleted. Ack and an idle Fetch call it at most every TrimInterval; call it directly to force
// a trim. During a cluster slot migration of the queue it retries TRYAGAIN
// (TryAgainBudget, within ctx). Safe for concurrent use.
func (c *Consumer) Trim(ctx context.Context) (int64, error) {
	var n int64
	err := retryTryAgain(ctx, func() (err error) {
		n, err = queuescript.Trim.Run(ctx, c.rdb, []string{c.keys.Stream, c.keys.Dedupe, c.keys.DedupeTokens}, trimBatch).Int64()
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
	moved, trimmed, err := c.dead.Move(ctx, c.group, d.StreamID, streamentry.Fields(d.Job), reason, c.dlMax)
	if err != nil {
		c.read.NoteNoGroup(ctx, err)
		return false, fmt.Errorf("redisq: dead-lettering %s: %w", d.StreamID, err)
	}
	c.read.Settled(d.StreamID)
	if !moved {
		c.logger.InfoContext(ctx, "entry to dead-letter already settled by another consumer; left alone",
			"stream_id", d.StreamID, "message_id", d.ID)
		return false, nil
	}
	c.logger.WarnContext(ctx, "dead-lettered entry", "stream_id", d.StreamID, "message_id", d.ID, "reason", reason)
	if trimmed > 0 {
		if c.on != nil {
			c.on(Event{Kind: EventDeadLetterTrimmed, Queue: c.queue, N: trimmed})
		}
		c.logger.WarnContext(ctx, "dead-letter stream full: oldest entries dropped", "dropped", trimmed, "max", c.dlMax)
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
