package inbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/redisq"
)

const (
	testQueue = "chat"
	testGroup = "workers"
)

// schemaSQL is the test inbox: chat_id must be positive, so a payload whose
// chat_id is the string "-7" decodes fine and then fails in SQL (23514), and
// "abc" fails the cast (22P02).
const schemaSQL = `
CREATE SCHEMA t;
CREATE TABLE t.inbox (
	message_id uuid   PRIMARY KEY,
	chat_id    bigint NOT NULL CHECK (chat_id > 0),
	seq        bigint NOT NULL,
	body       text   NOT NULL
)`

// payload is the test job body. ChatID stays raw so that a string passes
// decoding and reaches SQL.
type payload struct {
	ID     string          `json:"id"`
	ChatID json.RawMessage `json:"chat_id"`
	Seq    int64           `json:"seq"`
	Body   string          `json:"body"`
}

// applyInbox is the test Handler: decode and validate before touching tx,
// then INSERT ... ON CONFLICT DO NOTHING.
func applyInbox(ctx context.Context, tx pgx.Tx, d inbox.Delivery) (bool, error) {
	var p payload
	if err := json.Unmarshal(d.Payload, &p); err != nil {
		return false, fmt.Errorf("decoding payload: %w: %w", inbox.ErrMalformed, err)
	}
	id, err := uuid.Parse(p.ID)
	if err != nil {
		return false, fmt.Errorf("decoding payload id %q: %w: %w", p.ID, inbox.ErrMalformed, err)
	}
	chat := strings.Trim(string(p.ChatID), `"`)
	tag, err := tx.Exec(ctx, `INSERT INTO t.inbox (message_id, chat_id, seq, body)
		VALUES ($1, $2::text::bigint, $3, $4) ON CONFLICT (message_id) DO NOTHING`,
		id, chat, p.Seq, p.Body)
	if err != nil {
		return false, fmt.Errorf("inserting inbox row: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

var testHandler = inbox.HandlerFunc(applyInbox)

// env is one test's database, queue and log capture.
type env struct {
	pool   *pgxpool.Pool
	rdb    *redis.Client
	prefix string
	keys   redisq.Keys
	pub    *redisq.Publisher
	logs   *logBuffer
	log    *slog.Logger
}

func newEnv(t testing.TB) *env {
	t.Helper()
	return newEnvWithPool(t, testenv.Pool(t))
}

func newEnvWithPool(t testing.TB, pool *pgxpool.Pool) *env {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, schemaSQL); err != nil {
		t.Fatalf("creating schema: %v", err)
	}
	e := &env{pool: pool, rdb: testenv.Redis(t), prefix: testenv.Prefix(t), logs: &logBuffer{}}
	e.keys = redisq.NewKeys(e.prefix, testQueue)
	e.log = slog.New(slog.NewJSONHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	pub, err := redisq.NewPublisher(e.rdb, &redisq.PublisherConfig{Queue: testQueue, Prefix: e.prefix})
	if err != nil {
		t.Fatalf("creating publisher: %v", err)
	}
	e.pub = pub
	return e
}

// source returns a redisq consumer-group member named name.
func (e *env) source(t testing.TB, name string) inbox.Source {
	t.Helper()
	return e.sourceLocked(t, name, time.Minute) // reclaiming is not under test here
}

// sourceLocked is source with a lock duration of lock: another member
// takes over an entry this one holds that long.
func (e *env) sourceLocked(t testing.TB, name string, lock time.Duration) inbox.Source {
	t.Helper()
	q, err := redisq.NewConsumer(e.rdb, &redisq.ConsumerConfig{
		Queue: testQueue, Prefix: e.prefix, Group: testGroup, Consumer: name,
		LockDuration: lock, Block: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatalf("creating redisq consumer: %v", err)
	}
	return redisq.InboxSource(q)
}

// consumer returns an inbox Consumer with fast retries, stopped at cleanup.
func (e *env) consumer(t testing.TB, src inbox.Source, h inbox.Handler, cfg *inbox.Config) *inbox.Consumer {
	t.Helper()
	if cfg == nil {
		cfg = &inbox.Config{}
	}
	if cfg.RetryBackoff == 0 {
		cfg.RetryBackoff = 10 * time.Millisecond
		cfg.MaxRetryBackoff = 100 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = e.log
	}
	c, err := inbox.NewConsumer(e.pool, src, h, cfg)
	if err != nil {
		t.Fatalf("NewConsumer: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return c
}

func (e *env) add(t testing.TB, jobs ...redisq.Job) {
	t.Helper()
	if _, err := e.pub.Add(context.Background(), jobs...); err != nil {
		t.Fatalf("adding jobs: %v", err)
	}
}

// xadd appends j to the stream bypassing the dedupe key, as a re-sent or
// re-delivered job would arrive.
func (e *env) xadd(t testing.TB, j redisq.Job) {
	t.Helper()
	err := e.rdb.XAdd(context.Background(), &redis.XAddArgs{
		Stream: e.keys.Stream,
		Values: []any{"id", j.ID, "name", j.Name, "payload", j.Payload},
	}).Err()
	if err != nil {
		t.Fatalf("XADD: %v", err)
	}
}

func (e *env) rows(t testing.TB) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM t.inbox`).Scan(&n); err != nil {
		t.Fatalf("counting inbox rows: %v", err)
	}
	return n
}

// pending is the number of entries delivered to the group and not acked.
func (e *env) pending(t testing.TB) int64 {
	t.Helper()
	p, err := e.rdb.XPending(context.Background(), e.keys.Stream, testGroup).Result()
	if err != nil {
		t.Fatalf("XPENDING: %v", err)
	}
	return p.Count
}

func (e *env) deadLen(t testing.TB) int64 {
	t.Helper()
	n, err := e.rdb.XLen(context.Background(), e.keys.Dead).Result()
	if err != nil {
		t.Fatalf("XLEN dead: %v", err)
	}
	return n
}

// fetchAll fetches from src until it has n deliveries.
func fetchAll(t testing.TB, src inbox.Source, n int) []inbox.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var all []inbox.Delivery
	for len(all) < n {
		ds, err := src.Fetch(ctx, n-len(all))
		if err != nil {
			t.Fatalf("fetching %d deliveries (have %d): %v", n, len(all), err)
		}
		all = append(all, ds...)
	}
	return all
}

var seq atomic.Int64

// job returns a well-formed job for chat 1.
func job(body string) redisq.Job {
	id := uuid.NewString()
	p, _ := json.Marshal(map[string]any{"id": id, "chat_id": 1, "seq": seq.Add(1), "body": body})
	return redisq.Job{ID: id, Name: "message.created", Payload: p}
}

// rawJob returns a job with the given payload text.
func rawJob(payload string) redisq.Job {
	return redisq.Job{ID: uuid.NewString(), Name: "message.created", Payload: []byte(payload)}
}

// logBuffer collects JSON log lines; safe for concurrent use.
type logBuffer struct{ testenv.SyncBuffer }

// records returns the log records whose msg is msg.
func (b *logBuffer) records(t testing.TB, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for line := range strings.Lines(b.String()) {
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("decoding log line %q: %v", line, err)
		}
		if r["msg"] == msg {
			out = append(out, r)
		}
	}
	return out
}
