package receive

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/redisq"
)

// newRedriveFixture is a fresh database, a pool of the consumers' role and
// a publisher to the consumers' queue, for Redriver tests.
func newRedriveFixture(t *testing.T) (*chattest.Harness, *pgxpool.Pool, *redis.Client, *redisq.Publisher) {
	t.Helper()
	h := chattest.New(t, "")
	pool := h.RolePool(t, chat.Consumers)
	rdb := testenv.Redis(t)
	pub, err := redisq.NewPublisher(rdb, &redisq.PublisherConfig{Queue: chat.QueueName(chat.Consumers), Prefix: h.Prefix})
	if err != nil {
		t.Fatal(err)
	}
	return h, pool, rdb, pub
}

// streamMessages decodes every entry of pub's stream, in stream order; each
// must be a message.created event whose job id is the message id.
func streamMessages(t *testing.T, rdb *redis.Client, pub *redisq.Publisher) []chat.Message {
	t.Helper()
	entries, err := rdb.XRange(context.Background(), pub.Keys().Stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []chat.Message
	for _, e := range entries {
		m, err := chat.DecodeEvent([]byte(e.Values["payload"].(string)))
		if err != nil {
			t.Fatal(err)
		}
		if e.Values["name"] != chat.EventMessageCreated || e.Values["id"] != m.ID {
			t.Fatalf("entry %v: want name message.created and id = message id", e.Values)
		}
		out = append(out, m)
	}
	return out
}

// streamSeqs is the seqs of pub's stream's messages (streamMessages), in
// stream order, as fmt.Sprint prints them: "[2 3]".
func streamSeqs(t *testing.T, rdb *redis.Client, pub *redisq.Publisher) string {
	t.Helper()
	var seqs []int64
	for _, m := range streamMessages(t, rdb, pub) {
		seqs = append(seqs, m.Seq)
	}
	return fmt.Sprint(seqs)
}

// One pass publishes exactly the messages that are due: old enough, no
// receipt, not waiting for the relay, past their backoff; in seq order, past
// the dedupe key.
func TestRedriverRunOnceSelectsDueMessages(t *testing.T) {
	t.Parallel()
	h, pool, rdb, pub := newRedriveFixture(t)
	ctx := context.Background()
	var err error
	// seq 1: delivered; 2, 3: due; 4: too young; 5: its outbox row unsent.
	_, err = pool.Exec(ctx, `INSERT INTO consumers.messages (chat_id, seq, body, created_at) VALUES
		(5, 1, 'a', now() - interval '1 minute'),
		(5, 3, 'c', now() - interval '1 minute'),
		(5, 2, 'b', now() - interval '1 minute'),
		(5, 4, 'd', now()),
		(5, 5, 'e', now() - interval '1 minute');
		INSERT INTO consumers.receipts (chat_id, upto_seq, delivered_at) VALUES (5, 1, now())`)
	if err != nil {
		t.Fatal(err)
	}
	_, err = pool.Exec(ctx, `INSERT INTO consumers.outbox (event, idempotency_key, payload)
		SELECT 'message.created', id::text, '{}' FROM consumers.messages WHERE chat_id = 5 AND seq = 5`)
	if err != nil {
		t.Fatal(err)
	}
	// The dedupe mark of seq 2 is still there (its entry was lost).
	var id2 string
	if err := pool.QueryRow(ctx, `SELECT id::text FROM consumers.messages WHERE chat_id = 5 AND seq = 2`).Scan(&id2); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ZAdd(ctx, pub.Keys().Dedupe, redis.Z{Score: float64(time.Now().Add(time.Hour).UnixMilli()), Member: id2}).Err(); err != nil {
		t.Fatal(err)
	}
	var counted int
	rd, err := NewRedriver(pool, chat.Consumers, pub, &RedriveConfig{After: 10 * time.Second, Redriven: func(n int) { counted += n }})
	if err != nil {
		t.Fatal(err)
	}
	n, err := rd.RunOnce(ctx)
	if err != nil || n != 2 {
		t.Fatalf("RunOnce = %d, %v; want 2 (seqs 2 and 3)", n, err)
	}
	if seqs := streamSeqs(t, rdb, pub); seqs != "[2 3]" {
		t.Fatalf("stream holds seqs %v, want [2 3] in order", seqs)
	}
	if counted != 2 {
		t.Fatalf("Redriven hook counted %d, want 2", counted)
	}
	// Backoff: not again at once.
	if n, err := rd.RunOnce(ctx); err != nil || n != 0 {
		t.Fatalf("second RunOnce = %d, %v; want 0 (backoff)", n, err)
	}
	if n := h.Count(t, `SELECT count(*) FROM consumers.messages WHERE chat_id = 5 AND redrives = 1 AND redriven_at IS NOT NULL`); n != 2 {
		t.Fatalf("%d messages stamped, want 2", n)
	}
}

// The passes go round the chats ChatsPerPass at a time, and a full pass
// (MaxPerPass published) starts the next with the chat it stopped in: every
// due message is published once, each chat's in seq order, none skipped.
func TestRedriverGoesRoundTheChats(t *testing.T) {
	t.Parallel()
	_, pool, rdb, pub := newRedriveFixture(t)
	ctx := context.Background()
	// Due: chat 11 seqs 1–3, chat 12 seq 1, chat 13 seq 2 (seq 1 has its
	// receipt); chat 14's one message has its receipt.
	_, err := pool.Exec(ctx, `INSERT INTO consumers.messages (chat_id, seq, body, created_at)
		SELECT c, s, 'x', now() - interval '1 minute'
		FROM (VALUES (11, 1), (11, 2), (11, 3), (12, 1), (13, 1), (13, 2), (14, 1)) AS v(c, s);
		INSERT INTO consumers.receipts (chat_id, upto_seq, delivered_at) VALUES (13, 1, now()), (14, 1, now())`)
	if err != nil {
		t.Fatal(err)
	}
	rd, err := NewRedriver(pool, chat.Consumers, pub, &RedriveConfig{After: 10 * time.Second, ChatsPerPass: 2, MaxPerPass: 2})
	if err != nil {
		t.Fatal(err)
	}
	var perPass []int
	for range 6 {
		n, err := rd.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		perPass = append(perPass, n)
	}
	// [11 12]: 11/1, 11/2 (full); [11 12]: 11/3, 12/1 (full); [12 13]:
	// 13/2; [14]: the end, nothing; then round again: all backing off.
	if fmt.Sprint(perPass) != "[2 2 1 0 0 0]" {
		t.Fatalf("published per pass %v, want [2 2 1 0 0 0]", perPass)
	}
	var got []string
	for _, m := range streamMessages(t, rdb, pub) {
		got = append(got, fmt.Sprintf("%d/%d", m.ChatID, m.Seq))
	}
	if fmt.Sprint(got) != "[11/1 11/2 11/3 12/1 13/2]" {
		t.Fatalf("stream holds %v, want [11/1 11/2 11/3 12/1 13/2]", got)
	}
}

// A database clock stepped back (by an hour here) leaves the messages and
// re-drive stamps written before the step in its future: they are due at
// once rather than an hour later, and the backoff of a message re-driven
// "in the future" does not hold it back either.
func TestRedriveIsNotDelayedByAClockStepBack(t *testing.T) {
	t.Parallel()
	_, pool, rdb, pub := newRedriveFixture(t)
	ctx := context.Background()
	// seq 1 was sent an hour "ahead" (before the step); seq 2 was sent and
	// re-driven once an hour ahead; seq 3 is young by either clock.
	if _, err := pool.Exec(ctx, `INSERT INTO consumers.messages (chat_id, seq, body, created_at, redrives, redriven_at) VALUES
		(6, 1, 'a', now() + interval '1 hour', 0, NULL),
		(6, 2, 'b', now() + interval '1 hour', 1, now() + interval '1 hour'),
		(6, 3, 'c', now(), 0, NULL)`); err != nil {
		t.Fatal(err)
	}
	rd, err := NewRedriver(pool, chat.Consumers, pub, &RedriveConfig{After: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := rd.RunOnce(ctx); err != nil || n != 2 {
		t.Fatalf("RunOnce = %d, %v; want 2 (seqs 1 and 2, written before the step)", n, err)
	}
	if seqs := streamSeqs(t, rdb, pub); seqs != "[1 2]" {
		t.Fatalf("stream holds seqs %v, want [1 2]", seqs)
	}
	// Stamped now by the database clock: the ordinary backoff applies.
	if n, err := rd.RunOnce(ctx); err != nil || n != 0 {
		t.Fatalf("second RunOnce = %d, %v; want 0 (backoff)", n, err)
	}
}
