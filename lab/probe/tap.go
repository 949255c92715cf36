package probe

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

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

// lanes returns the streams of e's queues, every partition's.
func lanes(e *env.Env) []lane {
	var ls []lane
	for _, from := range []string{chat.Consumers, chat.Workers} {
		for p := range max(e.Partitions, 1) {
			ls = append(ls, lane{from, env.PartitionQueueKeys(from, p).Stream})
		}
	}
	return ls
}

// Tap reads the queue streams (every partition's) through a consumer
// group of its own
// and checks, independently of the services, that a chat's entries are
// added in seq order: an entry whose seq was not seen before and is below
// the highest seq seen of its chat is an order violation (an entry of a
// seq seen before is a re-send or a re-drive: allowed, the inbox drops
// it). Safe for concurrent use.
type Tap struct {
	rdb    redis.UniversalClient
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

// StartTap creates the tap's group on both streams of e (from the start)
// and starts reading them. Stop ends it.
func StartTap(ctx context.Context, e *env.Env) (*Tap, error) {
	t := &Tap{rdb: e.RedisClient(), seen: map[string]map[int64]map[int64]bool{}, top: map[string]map[int64]int64{}, inserted: map[string]int{},
		lanes: lanes(e), entries: map[string]map[string]string{}, confirmed: map[string]bool{}, early: map[string]string{}}
	for _, from := range []string{chat.Consumers, chat.Workers} {
		t.seen[from], t.top[from] = map[int64]map[int64]bool{}, map[int64]int64{}
	}
	for _, l := range t.lanes {
		err := t.rdb.XGroupCreateMkStream(ctx, l.stream, tapGroup, "0").Err()
		if err != nil && !strings.Contains(err.Error(), "BUSYGROUP") {
			return nil, fmt.Errorf("lab: torture: stream tap: %w", err)
		}
		t.entries[l.stream] = map[string]string{}
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	t.cancel = cancel
	for _, l := range t.lanes {
		t.wg.Add(1)
		go func() { defer t.wg.Done(); t.read(rctx, l) }()
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
				t.entry(l, m)
			}
			if len(ids) > 0 {
				_ = t.rdb.XAck(ctx, stream, tapGroup, ids...).Err()
			}
		}
	}
}

// entry records one stream entry of a message event.
func (t *Tap) entry(l lane, m redis.XMessage) {
	from := l.from
	if name, _ := m.Values["name"].(string); name != chat.EventMessageCreated {
		return // a receipt, or something else
	}
	payload, _ := m.Values["payload"].(string)
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
		t.entries[l.stream][m.ID] = ev.ID
	}
	seen := t.seen[from][ev.ChatID]
	if seen == nil {
		seen = map[int64]bool{}
		t.seen[from][ev.ChatID] = seen
	}
	if !seen[ev.Seq] && ev.Seq < t.top[from][ev.ChatID] {
		t.order = append(t.order, fmt.Sprintf("%s: chat %d seq %d added after seq %d (entry %s)",
			l.stream, ev.ChatID, ev.Seq, t.top[from][ev.ChatID], m.ID))
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
// receiving service's group has acknowledged (delivered: at or below the
// group's last-delivered id; and no longer pending) must have its message
// in the receiver's inbox. Read in that order — Redis first, then Postgres
// — an entry acknowledged only after its inbox commit is always found
// there; one acknowledged before its commit is caught while the commit is
// outstanding, and for good if the worker died in between. known, when
// set, says a message was in the inbox earlier (a row since deleted by
// retention counts as there). Errors (a server down) skip the sample.
func (t *Tap) SampleAcks(ctx context.Context, e *env.Env, known func(messageID string) bool) {
	for _, l := range t.lanes {
		from, stream := l.from, l.stream
		receiver := chat.Peer(from)
		t.mu.Lock()
		cand := map[string]string{}
		for ref, id := range t.entries[stream] {
			if !t.confirmed[stream+" "+ref] {
				cand[ref] = id
			}
		}
		t.mu.Unlock()
		if len(cand) == 0 {
			continue
		}
		groups, err := t.rdb.XInfoGroups(ctx, stream).Result()
		if err != nil {
			continue
		}
		last := ""
		for _, g := range groups {
			if g.Name == receiver {
				last = g.LastDeliveredID
			}
		}
		if last == "" {
			continue
		}
		pend, err := t.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: stream, Group: receiver, Start: "-", End: "+", Count: 1 << 20}).Result()
		if err != nil {
			continue
		}
		pending := map[string]bool{}
		for _, p := range pend {
			pending[p.ID] = true
		}
		acked := map[string]string{} // ref → message id
		var ids []string
		for ref, id := range cand {
			if !pending[ref] && streamIDLE(ref, last) {
				acked[ref] = id
				ids = append(ids, id)
			}
		}
		if len(ids) == 0 {
			continue
		}
		in := map[string]bool{}
		rows, err := e.Admin().Query(ctx, `SELECT message_id::text FROM `+receiver+`.inbox WHERE message_id::text = ANY($1)`, ids)
		if err != nil {
			continue
		}
		for rows.Next() {
			var id string
			if rows.Scan(&id) == nil {
				in[id] = true
			}
		}
		rows.Close()
		if rows.Err() != nil {
			continue
		}
		t.mu.Lock()
		for ref, id := range acked {
			if in[id] || (known != nil && known(id)) {
				t.confirmed[stream+" "+ref] = true
				continue
			}
			if _, ok := t.early[id]; !ok {
				t.early[id] = fmt.Sprintf("%s entry %s (message %s) acknowledged by %s before it was in its inbox", stream, ref, id, receiver)
			}
		}
		t.mu.Unlock()
	}
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
// been handed every entry (its last-delivered id is the stream's last id),
// else what is left.
func StreamDrained(ctx context.Context, e *env.Env, from string) string {
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

// MalformedEntry is the XADD of an entry no sender wrote: an event name
// and an id, no signature, a payload that is not an event.
func MalformedEntry(from, id string) *redis.XAddArgs {
	return &redis.XAddArgs{Stream: streamOf(from),
		Values: []any{"id", id, "name", chat.EventMessageCreated, "payload", "{not an event"}}
}
