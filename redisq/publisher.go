package redisq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/internal/queuescript"
	"github.com/outboxchat/outboxchat/internal/replicawait"
	"github.com/outboxchat/outboxchat/internal/streamentry"
	"github.com/outboxchat/outboxchat/outbox"
)

// checkQueueName rejects names that would break the keys' hash tag.
func checkQueueName(q string) error {
	if strings.ContainsAny(q, "{}") {
		return fmt.Errorf("queue name %q contains a brace: %w", q, ErrInvalidConfig)
	}
	return nil
}

// DefaultDedupeTTL is PublisherConfig.DedupeTTL's default: the longest an
// added job id is remembered, so that re-adding it is a no-op. A trim that
// removes the acknowledged entry deletes its id sooner.
const DefaultDedupeTTL = 24 * time.Hour

// DefaultReplicaAckTimeout is PublisherConfig.ReplicaAckTimeout's default:
// how long an add waits for replicas' acknowledgements when
// PublisherConfig.ReplicaAcks asks for them. It is half NewClient's read
// timeout (ClientReadTimeout), which bounds the wait's reply.
const DefaultReplicaAckTimeout = 500 * time.Millisecond

// ErrNotReplicated is returned (wrapped) by Publisher.Add and Readd when
// fewer replicas than PublisherConfig.ReplicaAcks acknowledged a call
// within ReplicaAckTimeout, or the wait itself failed: the master has the
// jobs (or had them, when it is an old master that was replaced) but a
// failover may lose them, so the call counts as failed. Retrying an Add is
// safe (adds are idempotent); retrying a Readd adds the jobs again, which
// the receiver drops as duplicates.
var ErrNotReplicated = replicawait.ErrNotReplicated

// ErrInvalidJob is returned (wrapped) by Publisher.Add for a job that cannot
// be added at all (an empty ID). Nothing of that call is sent.
var ErrInvalidJob = errors.New("redisq: invalid job")

// ErrInvalidConfig is returned (wrapped) by NewPublisher and NewConsumer for
// a config that cannot work.
var ErrInvalidConfig = errors.New("redisq: invalid config")

// PublisherConfig configures a Publisher. A nil *PublisherConfig is not
// allowed (Queue is required); zero fields take their defaults.
type PublisherConfig struct {
	// Queue names the queue (required; no "{" or "}": it becomes the
	// "{<queue>}" hash tag of the queue's keys).
	Queue string
	// Prefix is prepended to every key (default ""; e.g. "test42:").
	Prefix string
	// DedupeTTL is the longest an added job id is remembered (millisecond
	// resolution; default DefaultDedupeTTL). A job re-added after its dedupe
	// key expired, or after every group acknowledged it and the consumer
	// trimmed it (which deletes the key), is added again.
	DedupeTTL time.Duration
	// Logger receives debug logs (default slog.Default()).
	Logger *slog.Logger
	// OnEvent, when set, receives every typed Event of the Publisher. It
	// must be safe for concurrent use and must not block. Default nil.
	OnEvent func(Event)
	// Sign, when set, signs every added job whose Sig is empty: its result
	// becomes the entry's "sig" field (Job.Sig). It must be safe for
	// concurrent use and must not block. Default none: entries carry no
	// signature.
	Sign func(Job) string
	// ReplicaAcks, when above 0, makes Add and Readd wait after each
	// script call (up to maxScriptJobs jobs) until that many replicas of
	// the master acknowledged it (Redis WAIT on the call's own
	// connection), for at most ReplicaAckTimeout: fewer acknowledgements
	// fail the call with ErrNotReplicated. Redis replicates
	// asynchronously, so without it a write the master acknowledged can
	// be lost by a failover: the replica promoted had not got it yet, or
	// the old master, frozen past the failover, resumed and ran the call
	// before it learnt it was replaced (then resynced from the new master
	// and dropped it). A relay would have marked those jobs sent. With
	// ReplicaAcks equal to the replicas each master has (1 on a cluster of
	// one replica per master) a failover keeps every acknowledged add,
	// since whichever replica is promoted has it; with fewer, the promoted
	// replica may be one that did not acknowledge (Redis documents WAIT as
	// best effort for that reason).
	//
	// The price: per call one more write (an HSET of the re-add tokens'
	// placeholder, so that a call of duplicates alone still waits for the
	// first add's writes; the ACL needs +hset and +wait) and the round
	// trip from the master to its replicas, holding the connection
	// meanwhile; and no adds while the master has fewer replicas in sync
	// (they wait in the caller's outbox). It needs rdb to be a
	// *redis.Client (single server or Sentinel) or a *redis.ClusterClient;
	// on a cluster the call goes to the master of the queue's slot as the
	// client knows it, an ASK is followed once (ASKING) and a MOVED has the
	// client reload the slots' owners, both then retried like TRYAGAIN.
	// Default 0: no wait, as a plain Redis write.
	ReplicaAcks int
	// ReplicaAckTimeout bounds each wait of ReplicaAcks (millisecond
	// resolution; default DefaultReplicaAckTimeout), and is cut to end
	// 50 ms before the call's ctx deadline. It may be at most half rdb's
	// read timeout, which bounds the reply of the script and the wait
	// (a NOSCRIPT reply, after a restart, costs a second wait).
	ReplicaAckTimeout time.Duration
}

// EventKind names a typed event of the queue (Event.Kind). The values are
// stable strings, so a program can log them for another to read (the chat
// lab does).
type EventKind string

// Queue event kinds.
const (
	// EventAdded: an Add call added N new entries and skipped Duplicates
	// (both ≥ 0; the job ids were already in the queue's dedupe marks).
	EventAdded EventKind = "redisq.added"
	// EventReclaimed: a Fetch took over N > 0 stalled entries, pending on
	// some consumer for longer than LockDuration (XAUTOCLAIM).
	EventReclaimed EventKind = "redisq.reclaimed"
	// EventTrimmed: a trim removed N > 0 acknowledged entries.
	EventTrimmed EventKind = "redisq.trimmed"
	// EventDeadLetterTrimmed: DeadLetter dropped the N > 0 oldest entries
	// of the dead-letter stream to keep it at ConsumerConfig.DeadLetterMax.
	EventDeadLetterTrimmed EventKind = "redisq.dead_letter_trimmed"
	// EventDeletedPending: a Fetch found N > 0 of the group's pending
	// entries deleted from the stream (XDEL, a trim, a failover) and
	// acknowledged them away; their jobs are lost in Redis until the sender
	// re-drives them (Consumer.DeletedPending counts them too).
	EventDeletedPending EventKind = "redisq.deleted_pending"
	// EventGroupLost: a read or ack met NOGROUP (the stream or its group
	// vanished: FLUSHALL, a failover to an empty replica); the next Fetch
	// creates the group again from 0. Err is Redis's answer.
	EventGroupLost EventKind = "redisq.group_lost"
)

// Event is one typed event of a Publisher or Consumer, given to its
// config's OnEvent.
type Event struct {
	Kind  EventKind
	Queue string
	// N is the number of entries added, reclaimed, trimmed or found
	// deleted.
	N int64
	// Duplicates is the number of jobs skipped as already added
	// (EventAdded).
	Duplicates int
	// StreamIDs are the entries found deleted (EventDeletedPending).
	StreamIDs []string
	// Err is Redis's answer (EventGroupLost).
	Err error
}

// Publisher adds jobs to one queue. It is safe for concurrent use and holds
// no state besides its configuration: nothing is buffered between calls.
type Publisher struct {
	rdb    redis.UniversalClient
	keys   Keys
	queue  string
	ttlMS  int64
	logger *slog.Logger
	on     func(Event)
	sign   func(Job) string
	// acks and ackTimeout are ReplicaAcks and ReplicaAckTimeout.
	acks       int
	ackTimeout time.Duration
}

// NewPublisher returns a Publisher adding to cfg.Queue through rdb (use
// NewClient for a fail-fast client; the caller keeps owning rdb). Errors
// wrap ErrInvalidConfig: nil rdb or cfg, empty Queue, negative DedupeTTL or
// one below a millisecond, negative ReplicaAcks, ReplicaAckTimeout below a
// millisecond or above half rdb's read timeout, ReplicaAcks with an rdb
// that is neither a *redis.Client nor a *redis.ClusterClient.
func NewPublisher(rdb redis.UniversalClient, cfg *PublisherConfig) (*Publisher, error) {
	if rdb == nil {
		return nil, fmt.Errorf("redisq: new publisher: nil redis client: %w", ErrInvalidConfig)
	}
	if cfg == nil {
		return nil, fmt.Errorf("redisq: new publisher: Queue is required: %w", ErrInvalidConfig)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("redisq: new publisher: %w", err)
	}
	if err := checkAckClient(rdb, cfg); err != nil {
		return nil, fmt.Errorf("redisq: new publisher: %w", err)
	}
	return &Publisher{
		acks:       cfg.ReplicaAcks,
		ackTimeout: cfg.ReplicaAckTimeout,
		sign:       cfg.Sign,
		rdb:        rdb,
		keys:       NewKeys(cfg.Prefix, cfg.Queue),
		queue:      cfg.Queue,
		ttlMS:      cfg.DedupeTTL.Milliseconds(),
		logger:     cfg.Logger.With("component", "redisq", "queue", cfg.Queue),
		on:         cfg.OnEvent,
	}, nil
}

// WithDefaults returns a copy of c in which every zero field holds its
// default: DedupeTTL DefaultDedupeTTL, ReplicaAckTimeout
// DefaultReplicaAckTimeout, Logger slog.Default(). A nil c gives
// a config of defaults without Queue.
func (c *PublisherConfig) WithDefaults() *PublisherConfig {
	d := *cmp.Or(c, &PublisherConfig{})
	d.DedupeTTL = cmp.Or(d.DedupeTTL, DefaultDedupeTTL)
	d.Logger = cmp.Or(d.Logger, slog.Default())
	d.ReplicaAckTimeout = cmp.Or(d.ReplicaAckTimeout, DefaultReplicaAckTimeout)
	return &d
}

// validate checks a config that went through WithDefaults. Errors wrap
// ErrInvalidConfig.
func (c *PublisherConfig) validate() error {
	if c.Queue == "" {
		return fmt.Errorf("config: Queue is required: %w", ErrInvalidConfig)
	}
	if err := checkQueueName(c.Queue); err != nil {
		return err
	}
	if c.DedupeTTL < time.Millisecond {
		return fmt.Errorf("DedupeTTL %v below 1ms: %w", c.DedupeTTL, ErrInvalidConfig)
	}
	if c.ReplicaAcks < 0 {
		return fmt.Errorf("ReplicaAcks %d below 0: %w", c.ReplicaAcks, ErrInvalidConfig)
	}
	if c.ReplicaAckTimeout < time.Millisecond {
		return fmt.Errorf("ReplicaAckTimeout %v below 1ms: %w", c.ReplicaAckTimeout, ErrInvalidConfig)
	}
	return nil
}

// checkAckClient checks that rdb can serve cfg.ReplicaAcks: a client whose
// call can be followed by WAIT on its own connection, with a read timeout
// (if any) at least twice the wait's. Errors wrap ErrInvalidConfig.
func checkAckClient(rdb redis.UniversalClient, cfg *PublisherConfig) error {
	if cfg.ReplicaAcks == 0 {
		return nil
	}
	if err := replicawait.CheckClient(rdb, cfg.ReplicaAckTimeout); err != nil {
		return fmt.Errorf("ReplicaAcks, ReplicaAckTimeout %v: %w: %w", cfg.ReplicaAckTimeout, err, ErrInvalidConfig)
	}
	return nil
}

// Keys returns the queue's key names.
func (p *Publisher) Keys() Keys { return p.keys }

// Add adds jobs to the stream in slice order through add.lua, one
// atomic script call per maxScriptJobs jobs (per job: unless its dedupe
// mark is live, mark it for DedupeTTL in the queue's Keys.Dedupe sorted
// set, then XADD with fields id, name, payload, and sig and headers when
// set). It returns how many jobs were new; the others were
// duplicates of ids still in the stream (at most DedupeTTL; a trim forgets
// an id with its entry) or repeated within jobs, which count as success.
// Add with no jobs returns (0, nil).
//
// What Add puts in the stream is always a prefix of jobs, in order: a call
// that fails part way (Redis down or restarting, a timeout, OOM, ctx done)
// has added the jobs before some index and none after it, so a retry of all
// of them (safe: adds are idempotent) never puts an earlier job after a
// later one. added is then 0. Nothing is kept in memory for a later retry.
// A job with an empty ID, or headers beyond the limits of
// outbox.CheckHeaders (then outbox.ErrInvalidHeaders is wrapped too),
// fails the whole call with ErrInvalidJob before anything is sent; a job
// whose XADD the server refuses is a *JobError naming it (see JobFault).
// NOSCRIPT (the server's script cache emptied by a restart) is answered by
// sending the script itself. With PublisherConfig.ReplicaAcks a call that
// fewer replicas acknowledged fails with ErrNotReplicated.
//
// On a Redis Cluster (NewClient with a redis+cluster:// URL) the queue's
// keys share one slot. While that slot migrates, a call whose three keys
// (the stream, the dedupe marks and the re-add tokens) are not all on one
// node gets TRYAGAIN, and nothing of it runs: Add retries the call, for at
// most TryAgainBudget and within ctx, so the batch waits for the move and
// keeps its order. A CLUSTERDOWN reply fails the call at once
// (ErrClusterDown). Safe for concurrent use.
func (p *Publisher) Add(ctx context.Context, jobs ...Job) (added int, err error) {
	added, err = p.run(ctx, jobs, "")
	if err != nil || len(jobs) == 0 {
		return added, err
	}
	if p.on != nil {
		p.on(Event{Kind: EventAdded, Queue: p.queue, N: int64(added), Duplicates: len(jobs) - added})
	}
	return added, nil
}

// Readd adds jobs to the stream again whatever their dedupe marks say,
// through add.lua in its re-add mode (per job: its dedupe mark set
// for DedupeTTL and its re-add token to the call's, overwriting, then
// XADD), one atomic script call per maxScriptJobs jobs. It is the re-drive's add: a job whose dedupe mark
// survived while its stream entry was lost (FLUSHALL and a re-add, XDEL, a
// failover to a replica that had the mark and not the entry) is not
// mistaken for a duplicate. Every call adds a new entry per job, so the
// receiver must drop duplicates (the inbox does); within one call a job is
// added once, however often its command is sent (Keys.DedupeTokens holds a
// token of the call, and a resend that finds it adds nothing). It returns
// how many jobs were added (len(jobs) on success). Errors, order and
// cluster behaviour as for Add: what a failed call added is a prefix of
// jobs, and the caller retries all of them; ErrInvalidJob for an empty ID
// before anything is sent. Safe for concurrent use.
func (p *Publisher) Readd(ctx context.Context, jobs ...Job) (int, error) {
	return p.run(ctx, jobs, uuid.NewString())
}

// maxScriptJobs bounds the jobs of one script call (its KEYS and ARGV, and
// how long it holds the server): a larger batch is split into calls made
// one after the other, each only after the one before added all its jobs.
const maxScriptJobs = 500

// run runs add.lua for jobs, maxScriptJobs at a time, adding (token "") or
// re-adding with token, and returns the sum of the jobs added.
func (p *Publisher) run(ctx context.Context, jobs []Job, token string) (added int, err error) {
	if len(jobs) == 0 {
		return 0, nil
	}
	for i, j := range jobs {
		if j.ID == "" {
			return 0, &JobError{Index: i, Err: fmt.Errorf("job %d has an empty ID: %w", i, ErrInvalidJob)}
		}
		if err := outbox.CheckHeaders(j.Headers); err != nil {
			return 0, &JobError{Index: i, ID: j.ID, Err: fmt.Errorf("job %d: %w: %w", i, ErrInvalidJob, err)}
		}
	}
	for from := 0; from < len(jobs); from += maxScriptJobs {
		n, err := p.runOnce(ctx, jobs, from, min(from+maxScriptJobs, len(jobs)), token)
		if err != nil {
			return 0, err
		}
		added += n
	}
	return added, nil
}

// runOnce runs add.lua for jobs[from:to] in one call, retried while it
// gets TRYAGAIN (retryTryAgain's bounds).
func (p *Publisher) runOnce(ctx context.Context, jobs []Job, from, to int, token string) (int, error) {
	keys := []string{p.keys.Stream, p.keys.Dedupe, p.keys.DedupeTokens}
	batch := make([]streamentry.Fields, 0, to-from)
	for _, j := range jobs[from:to] {
		if j.Sig == "" && p.sign != nil {
			j.Sig = p.sign(j)
		}
		batch = append(batch, streamentry.Fields(j))
	}
	args := queuescript.AddArgs(p.ttlMS, token, batch)
	var reply []any
	err := retryTryAgain(ctx, func() (err error) {
		if p.acks > 0 {
			// WAIT counts the replicas that have the connection's last
			// write: the script, then a rewrite of the re-add tokens'
			// placeholder (a call of duplicates alone writes nothing
			// else), on the master of the queue's slot.
			reply, err = replicawait.Run(ctx, p.rdb, replicawait.Call{
				Script: queuescript.Add, Keys: keys, Args: args, Touch: p.keys.DedupeTokens,
				Replicas: p.acks, Timeout: p.ackTimeout,
			}, func(reply error) error { return &ClusterDownError{Err: reply} })
			return err
		}
		reply, err = queuescript.Add.Run(ctx, p.rdb, keys, args...).Slice()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("redisq: adding jobs: %w", err)
	}
	added, failed, msg, ok := queuescript.AddReply(reply)
	if !ok {
		return 0, fmt.Errorf("redisq: adding jobs: unexpected script reply %v", reply)
	}
	if failed > 0 {
		i := from + failed - 1
		return 0, &JobError{Index: i, ID: jobs[i].ID, Err: queuescript.JobReply(msg)}
	}
	return added, nil
}

// JobError is the error of Add and Readd that names the job it arose at:
// Index in the jobs given, ID, and Err (ErrInvalidJob for an empty ID or
// headers over the limits: then nothing was sent; else the server's error
// reply to that job's XADD: then the jobs before it were added and none
// after it). Errors of the whole call (Redis down, OOM, a key the ACL refuses, ctx
// done) are not JobErrors.
type JobError struct {
	Index int
	ID    string
	Err   error
}

func (e *JobError) Error() string {
	if e.ID == "" {
		return fmt.Sprintf("redisq: adding jobs: %v", e.Err)
	}
	return fmt.Sprintf("redisq: adding job %q: %v", e.ID, e.Err)
}

// Unwrap returns Err.
func (e *JobError) Unwrap() error { return e.Err }

// JobFault reports whether err (from Add) is the job's own fault rather
// than the server's or the connection's: an empty ID (ErrInvalidJob; then
// nothing was sent), or a plain "ERR ..." reply to that job's XADD (a
// command error from the job's arguments; every job before it was added,
// none after it). Replies that describe the server's state (OOM, READONLY,
// LOADING, NOPERM, WRONGTYPE, BUSY, an ACL refusal, …) and network errors
// are not: they fail every job alike.
func JobFault(err error) (*JobError, bool) {
	var je *JobError
	if !errors.As(err, &je) {
		return nil, false
	}
	if errors.Is(je.Err, ErrInvalidJob) {
		return je, true
	}
	var se queuescript.JobReply
	if errors.As(je.Err, &se) && se.JobFault() {
		return je, true
	}
	return nil, false
}
