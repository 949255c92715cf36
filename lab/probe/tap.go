package probe

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/lab/env"
)

// tapGroup is the consumer group of the stream tap: a group of
// its own, so it reads every entry without taking any from the services'
// groups (the trim waits for it too, so it misses none).
const tapGroup = "lab-torture-tap"

// streamOf returns the stream key of the queue from service from
// (partition 0's, with partitions).
func streamOf(from string) string { return env.QueueKeys(from).Stream }

// lane is one stream the tap reads: partition p's queue from service from.
type lane struct {
	from, stream string
}

// lanes returns the streams of e's queues, every partition's: Redis
// stream keys, or JetStream stream names with env.BrokerNATS.
func lanes(e *env.Env) []lane {
	var ls []lane
	for _, from := range []string{chat.Consumers, chat.Workers} {
		for p := range max(e.Partitions, 1) {
			stream := env.PartitionQueueKeys(from, p).Stream
			if e.Broker == env.BrokerNATS {
				stream, _, _ = env.NATSStreams(from, p)
			}
			ls = append(ls, lane{from, stream})
		}
	}
	return ls
}

// Tap reads the queue streams (every partition's) through a reader of
// its own and checks, independently of the services, that a chat's entries are
// added in seq order: an entry whose seq was not seen before and is below
// the highest seq seen of its chat is an order violation (an entry of a
// seq seen before is a re-send or a re-drive: allowed, the inbox drops
// it). Safe for concurrent use.
type Tap struct {
	rdb redis.UniversalClient
	// js is set with env.BrokerNATS: the tap then reads each stream with
	// an ordered consumer of its own (natsRead) and lanes name JetStream
	// streams.
	js     jetstream.JetStream
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	seen     map[string]map[int64]map[int64]bool // from → chat → seq
	top      map[string]map[int64]int64
	order    []string
	inserted map[string]int
	// lanes are the streams read; entries maps each message entry read to
	// its message id, per stream key; confirmed holds the entries (stream
	// key + " " + entry id) found acknowledged with their message in the
	// inbox; early the messages found acknowledged and not in the inbox
	// (id → what was seen).
	lanes     []lane
	entries   map[string]map[string]string
	confirmed map[string]bool
	early     map[string]string
}

// StartTap starts reading every queue stream of e from its start: on
// Redis through a consumer group of its own (tapGroup), on JetStream
// (env.BrokerNATS) through an ordered consumer of its own per stream,
// which takes nothing from the services' durable consumers. Stop ends it.
func StartTap(ctx context.Context, e *env.Env) (*Tap, error) {
	t := &Tap{rdb: e.RedisClient(), seen: map[string]map[int64]map[int64]bool{}, top: map[string]map[int64]int64{}, inserted: map[string]int{},
		lanes: lanes(e), entries: map[string]map[string]string{}, confirmed: map[string]bool{}, early: map[string]string{}}
	for _, from := range []string{chat.Consumers, chat.Workers} {
		t.seen[from], t.top[from] = map[int64]map[int64]bool{}, map[int64]int64{}
	}
	if e.Broker == env.BrokerNATS {
		nc, err := e.NATSConn()
		if err != nil {
			return nil, fmt.Errorf("lab: torture: stream tap: %w", err)
		}
		if t.js, err = jetstream.New(nc); err != nil {
			return nil, fmt.Errorf("lab: torture: stream tap: %w", err)
		}
	}
	for _, l := range t.lanes {
		t.entries[l.stream] = map[string]string{}
		if t.js != nil {
			continue
		}
		err := t.rdb.XGroupCreateMkStream(ctx, l.stream, tapGroup, "0").Err()
		if err != nil && !strings.Contains(err.Error(), "BUSYGROUP") {
			return nil, fmt.Errorf("lab: torture: stream tap: %w", err)
		}
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	t.cancel = cancel
	for _, l := range t.lanes {
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			if t.js != nil {
				t.natsRead(rctx, l)
				return
			}
			t.read(rctx, l)
		}()
	}
	return t, nil
}

// read reads the stream of l until ctx ends, riding out Redis restarts.
func (t *Tap) read(ctx context.Context, l lane) {
	stream := l.stream
	for ctx.Err() == nil {
		res, err := t.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: tapGroup, Consumer: "tap",
			Streams: []string{stream, ">"}, Count: 500, Block: 300 * time.Millisecond}).Result()
		if err == redis.Nil {
			continue
		}
		if err != nil {
			if strings.Contains(err.Error(), "NOGROUP") {
				_ = t.rdb.XGroupCreateMkStream(ctx, stream, tapGroup, "0").Err()
			}
			_ = env.SleepUntil(ctx, time.Now().Add(100*time.Millisecond))
			continue
		}
		for _, s := range res {
			ids := make([]string, 0, len(s.Messages))
			for _, m := range s.Messages {
				ids = append(ids, m.ID)
				name, _ := m.Values["name"].(string)
				payload, _ := m.Values["payload"].(string)
				t.entry(l, m.ID, name, payload)
			}
			if len(ids) > 0 {
				_ = t.rdb.XAck(ctx, stream, tapGroup, ids...).Err()
			}
		}
	}
}

// entry records one stream entry of a message event: ref is the entry's
// id in its stream (a Redis entry id, or a JetStream stream seq).
func (t *Tap) entry(l lane, ref, name, payload string) {
	from := l.from
	if name != chat.EventMessageCreated {
		return // a receipt, or something else
	}
	var ev struct {
		ID     string `json:"id"`
		ChatID int64  `json:"chat_id"`
		Seq    int64  `json:"seq"`
	}
	if json.Unmarshal([]byte(payload), &ev) != nil || ev.Seq <= 0 {
		return // a malformed entry (the schedule may inject some)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.entries != nil && t.entries[l.stream] != nil {
		t.entries[l.stream][ref] = ev.ID
	}
	seen := t.seen[from][ev.ChatID]
	if seen == nil {
		seen = map[int64]bool{}
		t.seen[from][ev.ChatID] = seen
	}
	if !seen[ev.Seq] && ev.Seq < t.top[from][ev.ChatID] {
		t.order = append(t.order, fmt.Sprintf("%s: chat %d seq %d added after seq %d (entry %s)",
			l.stream, ev.ChatID, ev.Seq, t.top[from][ev.ChatID], ref))
	}
	seen[ev.Seq] = true
	t.top[from][ev.ChatID] = max(t.top[from][ev.ChatID], ev.Seq)
}

// Injected counts one malformed entry added to the stream from service from.
func (t *Tap) Injected(from string) {
	t.mu.Lock()
	t.inserted[from]++
	t.mu.Unlock()
}

// InjectedCount returns how many malformed entries went to the stream from
// service from.
func (t *Tap) InjectedCount(from string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.inserted[from]
}

// Violations returns the order violations seen so far.
func (t *Tap) Violations() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.order...)
}

// SampleAcks checks invariant 4 from outside: every message entry the
// receiving service's group has acknowledged must have its message in the
// receiver's inbox. On Redis an entry is acknowledged when it is at or
// below the group's last-delivered id and no longer pending; on JetStream
// when its stream seq is at or below the durable consumer's ack floor
// (acks above the floor are not counted: the check only misses, never
// invents). Read in that order — the broker first, then Postgres — an
// entry acknowledged only after its inbox commit is always found there;
// one acknowledged before its commit is caught while the commit is
// outstanding, and for good if the worker died in between. known, when
// set, says a message was in the inbox earlier (a row since deleted by
// retention counts as there). Errors (a server down) skip the sample.
func (t *Tap) SampleAcks(ctx context.Context, e *env.Env, known func(messageID string) bool) {
	for _, l := range t.lanes {
		receiver := chat.Peer(l.from)
		t.mu.Lock()
		cand := map[string]string{}
		for ref, id := range t.entries[l.stream] {
			if !t.confirmed[l.stream+" "+ref] {
				cand[ref] = id
			}
		}
		t.mu.Unlock()
		if len(cand) == 0 {
			continue
		}
		var acked map[string]string // ref → message id
		if t.js != nil {
			acked = t.natsAcked(ctx, l.stream, receiver, cand)
		} else {
			acked = t.redisAcked(ctx, l.stream, receiver, cand)
		}
		if len(acked) > 0 {
			t.confirm(ctx, e, l.stream, receiver, acked, known)
		}
	}
}

// redisAcked returns the entries of cand (ref → message id) that group
// receiver of stream has acknowledged, nil when Redis cannot say.
func (t *Tap) redisAcked(ctx context.Context, stream, receiver string, cand map[string]string) map[string]string {
	groups, err := t.rdb.XInfoGroups(ctx, stream).Result()
	if err != nil {
		return nil
	}
	last := ""
	for _, g := range groups {
		if g.Name == receiver {
			last = g.LastDeliveredID
		}
	}
	if last == "" {
		return nil
	}
	pend, err := t.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: stream, Group: receiver, Start: "-", End: "+", Count: 1 << 20}).Result()
	if err != nil {
		return nil
	}
	pending := map[string]bool{}
	for _, p := range pend {
		pending[p.ID] = true
	}
	acked := map[string]string{}
	for ref, id := range cand {
		if !pending[ref] && streamIDLE(ref, last) {
			acked[ref] = id
		}
	}
	return acked
}

// confirm looks up the messages of acked (ref → message id, acknowledged
// entries of stream by receiver) in receiver's inbox: those there (or
// known) are confirmed for good, the others recorded as early acks.
func (t *Tap) confirm(ctx context.Context, e *env.Env, stream, receiver string, acked map[string]string, known func(string) bool) {
	ids := make([]string, 0, len(acked))
	for _, id := range acked {
		ids = append(ids, id)
	}
	in := map[string]bool{}
	rows, err := e.Admin().Query(ctx, `SELECT message_id::text FROM `+receiver+`.inbox WHERE message_id::text = ANY($1)`, ids)
	if err != nil {
		return
	}
	for rows.Next() {
		var id string
		if rows.Scan(&id) == nil {
			in[id] = true
		}
	}
	rows.Close()
	if rows.Err() != nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for ref, id := range acked {
		if in[id] || (known != nil && known(id)) {
			t.confirmed[stream+" "+ref] = true
			continue
		}
		if _, ok := t.early[id]; !ok {
			t.early[id] = fmt.Sprintf("%s entry %s (message %s) acknowledged by %s before it was in its inbox", stream, ref, id, receiver)
		}
	}
}

// Counts returns how many message entries the tap has read and how many
// of them SampleAcks has confirmed (acknowledged, message in the inbox):
// a run that sent messages and reads zero of either has a tap that saw
// nothing, and its order and ack checks proved nothing.
func (t *Tap) Counts() (read, confirmed int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, es := range t.entries {
		read += len(es)
	}
	return read, len(t.confirmed)
}

// EarlyAcks returns what SampleAcks found.
func (t *Tap) EarlyAcks() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]string, 0, len(t.early))
	for _, s := range t.early {
		out = append(out, s)
	}
	return out
}

// streamIDLE reports whether stream entry id a ("ms-seq") is at or below b.
func streamIDLE(a, b string) bool {
	am, as, _ := strings.Cut(a, "-")
	bm, bs, _ := strings.Cut(b, "-")
	if c := cmpDecimal(am, bm); c != 0 {
		return c < 0
	}
	return cmpDecimal(as, bs) <= 0
}

// cmpDecimal compares two decimal strings without leading zeros.
func cmpDecimal(a, b string) int {
	if len(a) != len(b) {
		if len(a) < len(b) {
			return -1
		}
		return 1
	}
	return strings.Compare(a, b)
}

// Stop ends the readers and waits for them.
func (t *Tap) Stop() {
	t.cancel()
	t.wg.Wait()
}

// StreamDrained returns "" when the receiving service's group of every
// stream (every partition's) from service from has nothing pending and has
// been handed every entry (on Redis its last-delivered id is the stream's
// last id; on JetStream its durable consumer has nothing pending nor
// unacknowledged), else what is left.
func StreamDrained(ctx context.Context, e *env.Env, from string) string {
	if e.Broker == env.BrokerNATS {
		return natsDrained(ctx, e, from)
	}
	for p := range max(e.Partitions, 1) {
		if s := streamDrained(ctx, e, env.PartitionQueueKeys(from, p).Stream); s != "" {
			return s
		}
	}
	return ""
}

// streamDrained is StreamDrained for one stream.
func streamDrained(ctx context.Context, e *env.Env, stream string) string {
	info, err := e.RedisClient().XInfoStream(ctx, stream).Result()
	if err != nil {
		if strings.Contains(err.Error(), "no such key") {
			return ""
		}
		return "redis: " + err.Error()
	}
	groups, err := e.RedisClient().XInfoGroups(ctx, stream).Result()
	if err != nil {
		return "redis: " + err.Error()
	}
	for _, g := range groups {
		if g.Name == tapGroup {
			continue
		}
		if g.Pending > 0 || g.LastDeliveredID != info.LastGeneratedID {
			return fmt.Sprintf("%s group %s: %d pending, last delivered %s of %s", stream, g.Name, g.Pending, g.LastDeliveredID, info.LastGeneratedID)
		}
	}
	return ""
}

// InjectMalformed adds to the queue from service from (partition 0's) an
// entry no sender wrote: an event name and the id id, no signature, a
// payload that is not an event; on Redis an XADD, on JetStream a publish
// into the stream. The receiver must dead-letter it.
func InjectMalformed(ctx context.Context, e *env.Env, from, id string) error {
	if e.Broker == env.BrokerNATS {
		return natsInjectMalformed(ctx, e, from, id)
	}
	return e.RedisClient().XAdd(ctx, &redis.XAddArgs{Stream: streamOf(from),
		Values: []any{"id", id, "name", chat.EventMessageCreated, "payload", "{not an event"}}).Err()
}

// DeadLetters returns how many dead letters the queue from service from
// (partition 0's) holds: its dead-letter stream's length.
func DeadLetters(ctx context.Context, e *env.Env, from string) (int64, error) {
	if e.Broker == env.BrokerNATS {
		return natsDeadLetters(ctx, e, from)
	}
	return e.RedisClient().XLen(ctx, env.QueueKeys(from).Dead).Result()
}
