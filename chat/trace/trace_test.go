package trace_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/chat/schema"
	"github.com/outboxchat/outboxchat/chat/trace"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/redisq"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestStagesInFlight: messages stopped at each place a message can wait
// are traced to that place: a pending and a parked outbox row, a stream
// entry not yet read and one read but not acknowledged, an inbox row held
// behind a gap, and a published message that nothing in Redis names.
func TestStagesInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := chattest.New(t, "")
	rdb, err := redisq.NewClient(h.RedisURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	keys := redisq.NewKeys(h.Prefix, chat.QueueName(chat.Consumers))
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := h.Admin.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	msg := func(chatID, seq int64) string {
		id := uuid.NewString()
		exec(`INSERT INTO consumers.messages (id, chat_id, seq, body) VALUES ($1, $2, $3, 'b')`, id, chatID, seq)
		return id
	}
	pending, parked, unread, unacked, lost, held := msg(1, 1), msg(2, 1), msg(3, 1), msg(4, 1), msg(5, 1), msg(6, 3)
	exec(`INSERT INTO consumers.outbox (event, idempotency_key, payload, attempts) VALUES ('message.created', $1, '{}', 2)`, pending)
	exec(`INSERT INTO consumers.outbox (event, idempotency_key, payload, attempts, failures, last_error, parked_at)
		VALUES ('message.created', $1, '{}', 10, 10, 'ERR boom', now())`, parked)
	if err := rdb.XGroupCreateMkStream(ctx, keys.Stream, chat.Workers, "0").Err(); err != nil {
		t.Fatal(err)
	}
	add := func(id string) string {
		sid, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream, Values: []any{"id", id, "name", "message.created", "payload", "{}"}}).Result()
		if err != nil {
			t.Fatal(err)
		}
		return sid
	}
	add(unacked)
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: chat.Workers, Consumer: "workers-w1", Streams: []string{keys.Stream, ">"}, Count: 1}).Err(); err != nil {
		t.Fatal(err)
	}
	add(unread)
	exec(`INSERT INTO workers.inbox (message_id, chat_id, seq, body, sender, sent_at, held) VALUES ($1, 6, 3, 'b', 'consumers', now(), true)`, held)

	stage := func(id, name string) trace.Stage {
		t.Helper()
		tr, err := trace.ByID(ctx, h.Admin, rdb, id, trace.Options{Prefix: h.Prefix})
		if err != nil {
			t.Fatalf("trace %s: %v", id, err)
		}
		if tr.Service != chat.Consumers || tr.Receiver != chat.Workers || tr.Stages[0].Stage != trace.StageStored {
			t.Fatalf("trace %s: %+v", id, tr)
		}
		for _, s := range tr.Stages {
			if s.Stage == name {
				return s
			}
		}
		t.Fatalf("trace %s has no %s stage: %+v", id, name, tr.Stages)
		return trace.Stage{}
	}
	if s := stage(pending, trace.StageOutbox); s.State != trace.StatePending || s.Attempts != 2 {
		t.Errorf("pending row: %+v", s)
	}
	if s := stage(parked, trace.StageOutbox); s.State != trace.StateParked || s.Reason != "ERR boom" || s.Failures != 10 {
		t.Errorf("parked row: %+v", s)
	}
	if s := stage(unread, trace.StagePublished); s.State != trace.StateUndelivered || s.At == nil {
		t.Errorf("unread entry: %+v", s)
	}
	if s := stage(unacked, trace.StagePublished); s.State != trace.StatePending || s.Consumer != "workers-w1" || s.Deliveries != 1 {
		t.Errorf("unacknowledged entry: %+v", s)
	}
	if s := stage(lost, trace.StagePublished); s.State != trace.StateNotFound || s.At != nil {
		t.Errorf("lost entry: %+v", s)
	}
	if s := stage(held, trace.StageReceived); s.State != trace.StateHeld {
		t.Errorf("held row: %+v", s)
	}
	exec(`INSERT INTO workers.inbox_gap_fills (chat_id, upto) VALUES (6, 3)`)
	if s := stage(held, trace.StageReceived); s.State != trace.StateShown {
		t.Errorf("row whose gap was filled: %+v", s)
	}

	// By chat and seq: each service numbers its own.
	if id, err := trace.Find(ctx, h.Admin, "", 2, 1); err != nil || id != parked {
		t.Errorf("Find(2, 1) = %q, %v; want %s", id, err, parked)
	}
	exec(`INSERT INTO workers.messages (id, chat_id, seq, body) VALUES ($1, 2, 1, 'w')`, uuid.NewString())
	if _, err := trace.Find(ctx, h.Admin, "", 2, 1); !errors.Is(err, trace.ErrAmbiguous) {
		t.Errorf("Find of a seq both have: %v, want ErrAmbiguous", err)
	}
	if id, err := trace.Find(ctx, h.Admin, chat.Consumers, 2, 1); err != nil || id != parked {
		t.Errorf("Find(consumers, 2, 1) = %q, %v", id, err)
	}
	if _, err := trace.ByID(ctx, h.Admin, nil, "not-a-uuid", trace.Options{}); !errors.Is(err, trace.ErrNotFound) {
		t.Errorf("unknown id: %v", err)
	}
	// Without Redis the stream stages are said to be missing.
	if tr, err := trace.ByID(ctx, h.Admin, nil, unread, trace.Options{}); err != nil || len(tr.Errors) != 1 {
		t.Errorf("without redis: %+v, %v", tr, err)
	}
	// Without Redis a published stage is not read, not trimmed (or not
	// found): one the receiver's inbox names, with its entry's time, and
	// one of a row gone from the outbox that nothing names.
	const sid = "1700000000000-0"
	exec(`INSERT INTO workers.inbox (message_id, chat_id, seq, body, sender, sent_at, stream_id) VALUES ($1, 4, 1, 'b', 'consumers', now(), $2)`, unacked, sid)
	for _, c := range []struct{ id, streamID string }{{unacked, sid}, {lost, ""}} {
		tr, err := trace.ByID(ctx, h.Admin, nil, c.id, trace.Options{})
		if err != nil {
			t.Fatal(err)
		}
		var published []trace.Stage
		for _, s := range tr.Stages {
			if s.Stage == trace.StagePublished {
				published = append(published, s)
			}
		}
		if len(published) != 1 || published[0].State != trace.StateNotRead || published[0].StreamID != c.streamID || (published[0].At != nil) != (c.streamID != "") {
			t.Errorf("without redis, published stages of %s: %+v, want one not read, stream_id %q", c.id, published, c.streamID)
		}
	}
}

// With partitions a trace reads the chat's partition: its outbox table
// and its stream.
func TestStagesInPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := chattest.New(t, "")
	const parts = 3
	if err := schema.EnsurePartitions(ctx, h.Admin, chat.Consumers, parts); err != nil {
		t.Fatal(err)
	}
	rdb, err := redisq.NewClient(h.RedisURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	msg := func(chatID int64) string {
		id := uuid.NewString()
		if _, err := h.Admin.Exec(ctx, `INSERT INTO consumers.messages (id, chat_id, seq, body) VALUES ($1, $2, 1, 'b')`, id, chatID); err != nil {
			t.Fatal(err)
		}
		return id
	}
	pending, unread := msg(5), msg(4) // partitions 2 and 1
	if _, err := h.Admin.Exec(ctx, `INSERT INTO consumers.outbox_p2 (event, idempotency_key, payload) VALUES ('message.created', $1, '{}')`, pending); err != nil {
		t.Fatal(err)
	}
	stream := redisq.NewKeys(h.Prefix, chat.PartitionQueue(chat.Consumers, 1)).Stream
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"id", unread, "name", "message.created", "payload", "{}"}}).Err(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		id, stage, state string
		partition        int
	}{{pending, trace.StageOutbox, trace.StatePending, 2}, {unread, trace.StagePublished, trace.StateUndelivered, 1}} {
		tr, err := trace.ByID(ctx, h.Admin, rdb, c.id, trace.Options{Prefix: h.Prefix})
		if err != nil {
			t.Fatal(err)
		}
		if tr.Partition != c.partition {
			t.Errorf("trace %s: partition %d, want %d", c.id, tr.Partition, c.partition)
		}
		found := false
		for _, s := range tr.Stages {
			found = found || s.Stage == c.stage && s.State == c.state
		}
		if !found {
			t.Errorf("trace %s: no %s stage %s: %+v", c.id, c.stage, c.state, tr.Stages)
		}
	}
}
