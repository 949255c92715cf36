// Package natsq is the outbox's second broker: a queue on NATS JetStream,
// beside redisq's Redis Streams, with the same two adapters — OutboxPublisher
// for the relay (outbox.Publisher) and InboxSource for the inbox
// (inbox.Source) — and the same conformance suite (brokertest).
//
// The shape, per queue:
//   - one stream, "<prefix><queue>", on subject "<prefix><queue>.events"
//     (file storage, limits retention: every consumer group reads every
//     event; Config.MaxAge and MaxBytes bound it);
//   - a dead-letter stream, "<prefix><queue>_dead", on subject
//     "<prefix><queue>.dead";
//   - a durable pull consumer per group, named after the group, with
//     explicit acks. Its AckWait is the lock duration: an event a consumer
//     fetched and did not acknowledge within it is delivered again, to any
//     consumer of the group (a crashed process's events go to the others).
//
// Publishes are deduplicated by the stream: each event carries its id (the
// outbox's idempotency key) as Nats-Msg-Id, and the stream drops a second
// publish of an id within its duplicate window (Config.Duplicates, default
// 2 minutes, the NATS default). Past the window a re-publish is stored
// again; the relay only re-publishes a row whose publish had an unknown
// outcome, on its next pass (milliseconds to seconds later, or after a
// relay restart), and the inbox drops a duplicate by its id in any case, so
// a window shorter than a relay outage costs a duplicate delivery, never a
// duplicate effect.
//
// Headers: the event name is carried as header Outbox-Event, each of
// outbox.Message.Headers as "Outbox-Header-<key>", and a signature
// (Config.Sign) as Outbox-Sig, which InboxSource hands the inbox as
// inbox.Delivery.Sig (NATS's own account and subject permissions say who
// may publish into a stream; a signature says who wrote the event).
//
// Republish is the re-drive's publish: it stores the events again whatever
// the duplicate window says (each under a fresh Nats-Msg-Id, the event id
// in header Outbox-Id, which a consumer reads as the id).
//
// The module holds nats.go; the library module (outbox, inbox, redisq)
// does not, so a Redis user never compiles NATS in.
package natsq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxchat/outboxchat/internal/natsname"
)

// Defaults of Config.
const (
	// DefaultDuplicates is the stream's duplicate window (NATS's own
	// default): a publish of an id seen within it is dropped.
	DefaultDuplicates = 2 * time.Minute
	// DefaultLockDuration is a group consumer's AckWait, as redisq's
	// DefaultLockDuration.
	DefaultLockDuration = 30 * time.Second
	// DefaultFetchWait is the longest Fetch waits for new events.
	DefaultFetchWait = time.Second
)

// Header names natsq sets on every event.
const (
	HeaderEvent  = "Outbox-Event"
	headerPrefix = "Outbox-Header-"
	// HeaderSig carries the event's signature (Config.Sign).
	HeaderSig = "Outbox-Sig"
	// HeaderID carries the event id of a Republish, whose Nats-Msg-Id is
	// a fresh one; a consumer takes it over Nats-Msg-Id.
	HeaderID = "Outbox-Id"
	// HeaderReason and HeaderOrigin are set on a dead letter: why it was
	// dead-lettered, and its sequence in the queue's stream.
	HeaderReason = "Outbox-Dead-Reason"
	HeaderOrigin = "Outbox-Dead-Stream-Seq"
)

// ErrInvalidConfig is wrapped by New's errors for a bad Config.
var ErrInvalidConfig = errors.New("natsq: invalid config")

// Config names a queue and tunes its streams. The zero values of the
// durations and limits mean their defaults.
type Config struct {
	// Queue names the queue (required): letters, digits, '-' and '_'.
	Queue string
	// Prefix is prepended to the stream and subject names (default "";
	// same character set as Queue).
	Prefix string
	// Duplicates is the duplicate window (default DefaultDuplicates).
	Duplicates time.Duration
	// MaxAge bounds how long the stream keeps an event, acknowledged or
	// not (default 0: for ever, until MaxBytes).
	MaxAge time.Duration
	// MaxBytes bounds the stream's size; the oldest events go first
	// (default 0: no bound).
	MaxBytes int64
	// Replicas is the streams' replica count (default 1; 3 on a
	// three-node JetStream cluster).
	Replicas int
	// Sign, when set, signs every published event whose Sig is empty: its
	// result goes in header HeaderSig. It must be safe for concurrent use.
	// Default nil: events carry the Sig they were given, if any.
	Sign func(Event) string
}

// Queue is one queue's streams on a JetStream: what New made sure exists.
// It is safe for concurrent use.
type Queue struct {
	nc                *nats.Conn
	js                jetstream.JetStream
	cfg               Config
	stream, dead      string
	subject, deadSubj string
	stre, deadStream  jetstream.Stream
}

// Connect dials url for natsq: reconnecting for ever every 100 ms, and with
// the reconnect buffer off, so that a publish while the server is away
// fails at once (the relay keeps its rows and tries again) instead of
// waiting in the client's memory. The caller closes the connection.
func Connect(url string, opts ...nats.Option) (*nats.Conn, error) {
	base := []nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond), nats.ReconnectBufSize(-1),
		nats.Timeout(2 * time.Second)}
	nc, err := nats.Connect(url, append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("natsq: connect: %w", err)
	}
	return nc, nil
}

// New makes sure the queue's stream and dead-letter stream exist (creating
// or updating them to cfg) and returns the Queue; a request the server
// leaves unanswered for 2 s is asked again until ctx ends. Errors wrap
// ErrInvalidConfig, or are the server's, or ctx's.
func New(ctx context.Context, nc *nats.Conn, cfg Config) (*Queue, error) {
	if cfg.Duplicates <= 0 {
		cfg.Duplicates = DefaultDuplicates
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	q, err := newQueue(nc, cfg)
	if err != nil {
		return nil, err
	}

	q.stre, err = ensure(ctx, func(ctx context.Context) (jetstream.Stream, error) {
		return q.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: q.stream, Subjects: []string{q.subject},
			Storage: jetstream.FileStorage, Retention: jetstream.LimitsPolicy, Duplicates: cfg.Duplicates,
			MaxAge: cfg.MaxAge, MaxBytes: orNoLimit(cfg.MaxBytes), Replicas: cfg.Replicas})
	})
	if err != nil {
		return nil, fmt.Errorf("natsq: stream %s: %w", q.stream, err)
	}
	q.deadStream, err = ensure(ctx, func(ctx context.Context) (jetstream.Stream, error) {
		return q.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: q.dead, Subjects: []string{q.deadSubj},
			Storage: jetstream.FileStorage, Retention: jetstream.LimitsPolicy, Duplicates: cfg.Duplicates, Replicas: cfg.Replicas})
	})
	if err != nil {
		return nil, fmt.Errorf("natsq: stream %s: %w", q.dead, err)
	}
	return q, nil
}

// ensureAttempt bounds one attempt of ensure.
const ensureAttempt = 2 * time.Second

// ensure runs a JetStream API call that makes sure of a stream or a
// consumer, asking again each time one goes ensureAttempt unanswered,
// until ctx ends: a clustered nats-server (2.9) may leave one of two
// concurrent creates of the same stream unanswered, and two services, or
// two processes of one, make sure of the same streams at their starts.
// Other errors are returned at once.
func ensure[T any](ctx context.Context, call func(context.Context) (T, error)) (T, error) {
	for {
		actx, cancel := context.WithTimeout(ctx, ensureAttempt)
		v, err := call(actx)
		cancel()
		if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			return v, err
		}
	}
}

func orNoLimit(n int64) int64 {
	if n <= 0 {
		return -1
	}
	return n
}

// Open returns the Queue of cfg's existing streams, as New made them,
// without creating or changing anything: for tools (listing and replaying
// dead letters) that must not alter a stream the services configured.
// Only cfg.Queue, cfg.Prefix and cfg.Sign matter. It fails when a stream
// is missing (wrapping jetstream.ErrStreamNotFound), or with the server's
// or ctx's error.
func Open(ctx context.Context, nc *nats.Conn, cfg Config) (*Queue, error) {
	q, err := newQueue(nc, cfg)
	if err != nil {
		return nil, err
	}
	if q.stre, err = q.js.Stream(ctx, q.stream); err != nil {
		return nil, fmt.Errorf("natsq: stream %s: %w", q.stream, err)
	}
	if q.deadStream, err = q.js.Stream(ctx, q.dead); err != nil {
		return nil, fmt.Errorf("natsq: stream %s: %w", q.dead, err)
	}
	return q, nil
}

// newQueue checks cfg's names and returns the Queue of cfg on nc, its
// streams not looked up yet (New and Open do). Errors wrap
// ErrInvalidConfig, or are jetstream.New's.
func newQueue(nc *nats.Conn, cfg Config) (*Queue, error) {
	if nc == nil || !natsname.Valid(cfg.Queue) || (cfg.Prefix != "" && !natsname.Valid(cfg.Prefix)) {
		return nil, fmt.Errorf("natsq: need a connection and a queue name of letters, digits, - and _ (queue %q, prefix %q): %w", cfg.Queue, cfg.Prefix, ErrInvalidConfig)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("natsq: %w", err)
	}
	q := &Queue{nc: nc, js: js, cfg: cfg}
	q.stream, q.dead, q.subject = Names(cfg.Prefix, cfg.Queue)
	q.deadSubj = q.stream + ".dead"
	return q, nil
}

// Names returns the names New gives the queue of Config.Prefix prefix and
// Config.Queue queue: its stream, its dead-letter stream, and the subject
// its events are published on. For tools that look at the streams (or
// publish into one) without a Queue; it does not check the names.
func Names(prefix, queue string) (stream, dead, subject string) {
	name := prefix + queue
	return name, name + "_dead", name + ".events"
}

// Stream returns the queue's stream name; DeadStream its dead letters'.
func (q *Queue) Stream() string     { return q.stream }
func (q *Queue) DeadStream() string { return q.dead }

// Event is one event to publish: ID is the idempotency key (Nats-Msg-Id);
// Sig its signature, "" for none (Config.Sign fills it).
type Event struct {
	ID, Name string
	Payload  []byte
	Headers  map[string]string
	Sig      string
}

// ErrInvalidEvent is wrapped by the *EventError of an event that can never
// be published: an empty id, or a message over the server's max payload.
var ErrInvalidEvent = errors.New("natsq: invalid event")

// EventError names the event of a batch that failed through its own fault;
// every event before it was published, none after it was sent.
type EventError struct {
	Index int
	Err   error
}

func (e *EventError) Error() string { return fmt.Sprintf("natsq: event %d: %v", e.Index, e.Err) }
func (e *EventError) Unwrap() error { return e.Err }

// Publish publishes evs in order and waits for the stream's acks (one
// round trip for the batch: the publishes are pipelined). A duplicate
// within the window is acked without being stored again. An event that can
// never be published (EventError) is found before anything is sent. Any
// other error (server away, no ack before ctx's deadline) leaves the batch
// in an unknown state: publish it again, the ids keep it once. Safe for
// concurrent use.
func (q *Queue) Publish(ctx context.Context, evs ...Event) error {
	return q.publish(ctx, evs, "")
}

// Republish publishes evs again whatever the duplicate window says: the
// re-drive's publish, for events whose first copy may be gone from the
// stream (its MaxAge or MaxBytes took it, the stream was purged, a
// consumer's ack was recorded for a copy the inbox never committed). Each
// event gets a fresh Nats-Msg-Id, "<id>.r<unix nanos>-<index>", so within
// one call a resend of the batch adds nothing again, and its id in header
// HeaderID, which consumers read as the event's id: every call stores a
// new copy, and the inbox drops the ones it has. Errors as Publish's. Safe
// for concurrent use.
func (q *Queue) Republish(ctx context.Context, evs ...Event) error {
	return q.publish(ctx, evs, ".r"+strconv.FormatInt(time.Now().UnixNano(), 10)+"-")
}

// publish is Publish, or Republish when redo (the fresh ids' suffix
// before the index) is set.
func (q *Queue) publish(ctx context.Context, evs []Event, redo string) error {
	msgs := make([]*nats.Msg, len(evs))
	ids := make([]string, len(evs))
	max := q.nc.MaxPayload()
	for i, e := range evs {
		if e.ID == "" {
			return &EventError{Index: i, Err: fmt.Errorf("empty id: %w", ErrInvalidEvent)}
		}
		if e.Sig == "" && q.cfg.Sign != nil {
			e.Sig = q.cfg.Sign(e)
		}
		m := q.message(q.subject, e)
		ids[i] = e.ID
		if redo != "" {
			m.Header.Set(HeaderID, e.ID)
			ids[i] = e.ID + redo + strconv.Itoa(i)
		}
		if size := int64(len(m.Data) + headerSize(m.Header) + len(ids[i]) + 64); size > max {
			return &EventError{Index: i, Err: fmt.Errorf("%d bytes over the server's max payload %d: %w", size, max, ErrInvalidEvent)}
		}
		msgs[i] = m
	}
	if !q.nc.IsConnected() {
		// The reconnect buffer is off: a publish now would fail with
		// "outbound buffer limit exceeded"; say what it is.
		return fmt.Errorf("natsq: publish: not connected to the server (%v)", q.nc.Status())
	}
	futs := make([]jetstream.PubAckFuture, 0, len(msgs))
	for i, m := range msgs {
		f, err := q.js.PublishMsgAsync(m, jetstream.WithMsgID(ids[i]))
		if err != nil {
			return fmt.Errorf("natsq: publish: %w", err)
		}
		futs = append(futs, f)
	}
	for _, f := range futs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return fmt.Errorf("natsq: publish: %w", err)
		case <-ctx.Done():
			return fmt.Errorf("natsq: publish: waiting for acks: %w", ctx.Err())
		}
	}
	return nil
}

// message is e as a message on subject, its name, headers and signature
// in headers (not its id: the caller sets Nats-Msg-Id).
func (q *Queue) message(subject string, e Event) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Data = e.Payload
	m.Header.Set(HeaderEvent, e.Name)
	for k, v := range e.Headers {
		m.Header.Set(headerPrefix+k, v)
	}
	if e.Sig != "" {
		m.Header.Set(HeaderSig, e.Sig)
	}
	return m
}

func headerSize(h nats.Header) int {
	n := 0
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

// DeadLetter is an event in the dead-letter stream.
type DeadLetter struct {
	Event
	// Reason is why it was dead-lettered; StreamSeq its sequence in the
	// queue's stream; Seq its sequence in the dead-letter stream.
	Reason         string
	StreamSeq, Seq uint64
	At             time.Time
}

// DeadLetters lists up to max dead letters from sequence after+1 on,
// oldest first.
func (q *Queue) DeadLetters(ctx context.Context, after uint64, max int) ([]DeadLetter, error) {
	info, err := q.deadStream.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("natsq: dead letters: %w", err)
	}
	var out []DeadLetter
	for seq := max64(after+1, info.State.FirstSeq); seq <= info.State.LastSeq && len(out) < max; seq++ {
		dl, ok, err := q.DeadLetterAt(ctx, seq)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, dl)
		}
	}
	return out, nil
}

// DeadLetterAt returns the dead letter at sequence seq of the
// dead-letter stream; ok is false when there is none (never, or dropped or
// replayed since).
func (q *Queue) DeadLetterAt(ctx context.Context, seq uint64) (_ DeadLetter, ok bool, _ error) {
	m, err := q.deadStream.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return DeadLetter{}, false, nil
	}
	if err != nil {
		return DeadLetter{}, false, fmt.Errorf("natsq: dead letter %d: %w", seq, err)
	}
	dl := DeadLetter{Event: eventOf(m.Header, m.Data), Reason: m.Header.Get(HeaderReason), Seq: seq, At: m.Time}
	fmt.Sscan(m.Header.Get(HeaderOrigin), &dl.StreamSeq)
	return dl, true, nil
}

// Replay puts the dead letters at seqs back on the queue's stream, in
// order, and deletes each from the dead-letter stream once its copy is
// stored: its event, headers and signature as they were, under a fresh
// Nats-Msg-Id (Republish: the first copy may still be inside the
// duplicate window, which would drop it). done[i] says whether seqs[i] was
// there. A crash between the publish and the delete leaves both; a second
// Replay then stores another copy, which the inbox drops (at-least-once).
// It stops at the first error, with done filled so far.
func (q *Queue) Replay(ctx context.Context, seqs ...uint64) (done []bool, _ error) {
	for _, seq := range seqs {
		dl, ok, err := q.DeadLetterAt(ctx, seq)
		if err != nil {
			return done, err
		}
		if ok {
			if err := q.Republish(ctx, dl.Event); err != nil {
				return done, err
			}
			if _, err := q.DropDeadLetter(ctx, seq); err != nil {
				return done, err
			}
		}
		done = append(done, ok)
	}
	return done, nil
}

// DropDeadLetter deletes the dead letter at seq; false when it was not
// there (dropped or replayed before).
func (q *Queue) DropDeadLetter(ctx context.Context, seq uint64) (bool, error) {
	err := q.deadStream.DeleteMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful) {
		// The client reports the server's reason as text only; a message
		// that is not there is told apart by looking it up.
		if _, gerr := q.deadStream.GetMsg(ctx, seq); errors.Is(gerr, jetstream.ErrMsgNotFound) {
			return false, nil
		}
	}
	if err != nil {
		return false, fmt.Errorf("natsq: drop dead letter %d: %w", seq, err)
	}
	return true, nil
}

func max64(a, b uint64) uint64 {
	if a > b {
		return a
	}
	return b
}

// eventOf reads an event back from a message's headers and data.
// The id is HeaderID's when set (a Republish), else Nats-Msg-Id.
func eventOf(h nats.Header, data []byte) Event {
	e := Event{ID: cmp.Or(h.Get(HeaderID), h.Get(jetstream.MsgIDHeader)), Name: h.Get(HeaderEvent), Payload: data,
		Sig: h.Get(HeaderSig)}
	for k, vs := range h {
		if name, ok := strings.CutPrefix(k, headerPrefix); ok && len(vs) > 0 {
			if e.Headers == nil {
				e.Headers = map[string]string{}
			}
			e.Headers[name] = vs[0]
		}
	}
	return e
}
