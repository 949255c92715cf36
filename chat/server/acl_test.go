package server

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/chat/schema"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/redisq"
)

// TestRedisACLLeastPrivilege makes each service's Redis user with
// RedisACL, runs both services with those credentials (messages must flow
// both ways: the rules are enough), and checks what consumers' credentials
// cannot do: add to the stream consumers reads (forge messages to itself),
// add to or delete workers' outbound keys, FLUSHALL, CONFIG, KEYS.
func TestRedisACLLeastPrivilege(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	ctx := context.Background()
	admin := testenv.Redis(t)
	urls := map[string]string{}
	for _, s := range []string{chat.Consumers, chat.Workers} {
		user := strings.TrimSuffix(h.Prefix, ":") + "-" + s
		args, err := schema.RedisACL(s, h.Prefix, user, "pw-"+user)
		if err != nil {
			t.Fatal(err)
		}
		if line := schema.RedisACLLine(args); strings.Contains(line, "pw-"+user) || !strings.HasPrefix(line, "ACL SETUSER "+user+" reset #") {
			t.Fatalf("printed line shows the password or is malformed: %s", line)
		}
		if err := schema.ApplyRedisACL(ctx, admin, args); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { admin.Do(context.Background(), "ACL", "DELUSER", user) })
		urls[s] = withRedisUser(t, h.RedisURL, user)
	}
	cons, _ := sendThreeEachWay(t, h, urls, 11)

	rdb, err := redisq.NewClient(urls[chat.Consumers])
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	in := redisq.NewKeys(h.Prefix, chat.QueueName(chat.Workers))    // what consumers reads
	out := redisq.NewKeys(h.Prefix, chat.QueueName(chat.Consumers)) // what consumers writes
	denied := func(what string, err error) {
		t.Helper()
		// Inside a script Redis says "can't access" instead of NOPERM.
		if err == nil || !strings.Contains(err.Error(), "NOPERM") && !strings.Contains(err.Error(), "can't access") {
			t.Errorf("consumers' credentials: %s: %v, want a permission error", what, err)
		}
	}
	denied("XADD to the stream it reads", rdb.XAdd(ctx, &redis.XAddArgs{Stream: in.Stream, Values: []any{"id", "x", "name", chat.EventMessageCreated, "payload", "{}"}}).Err())
	denied("add.lua on the stream it reads", rdb.Eval(ctx, `return redis.call('XADD', KEYS[1], '*', 'id', 'x')`, []string{in.Stream}).Err())
	denied("a script adding to it without declaring it", rdb.Eval(ctx, `return redis.call('XADD', ARGV[1], '*', 'id', 'x')`, nil, in.Stream).Err())
	denied("ZADD to workers' dedupe marks", rdb.ZAdd(ctx, in.Dedupe, redis.Z{Score: 1, Member: "x"}).Err())
	denied("DEL of workers' stream", rdb.Del(ctx, in.Stream).Err())
	denied("FLUSHALL", rdb.FlushAll(ctx).Err())
	denied("CONFIG GET", rdb.ConfigGet(ctx, "appendonly").Err())
	denied("CONFIG SET", rdb.ConfigSet(ctx, "appendonly", "no").Err())
	denied("KEYS", rdb.Keys(ctx, "*").Err())
	denied("XRANGE of its own outbound stream", rdb.XRange(ctx, out.Stream, "-", "+").Err())
	denied("a key outside the prefix", rdb.Set(ctx, "elsewhere", "1", 0).Err())
	// The durability check falls back from CONFIG GET to INFO.
	var logs testenv.SyncBuffer
	if err := redisq.CheckDurability(ctx, rdb, slog.New(slog.NewTextHandler(&logs, nil))); err != nil || logs.String() != "" {
		t.Errorf("durability check as consumers: %v, logged %q; want nil and nothing", err, logs.String())
	}
	// What it needs still works: read its inbound stream, add to its own.
	if err := rdb.XRange(ctx, in.Stream, "-", "+").Err(); err != nil {
		t.Errorf("XRANGE of its inbound stream: %v", err)
	}
	pub, err := redisq.NewPublisher(rdb, &redisq.PublisherConfig{Queue: chat.QueueName(chat.Consumers), Prefix: h.Prefix})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Add(ctx, redisq.Job{ID: "acl-check", Name: "noop", Payload: []byte("{}")}); err != nil {
		t.Errorf("add to its outbound queue: %v", err)
	}
	if _, err := pub.Readd(ctx, redisq.Job{ID: "acl-check", Name: "noop", Payload: []byte("{}")}); err != nil {
		t.Errorf("re-add to its outbound queue: %v", err)
	}
	// The wait for replicas is allowed: this Redis has none, so the add
	// fails for want of them, not of a permission.
	acked, err := redisq.NewPublisher(rdb, &redisq.PublisherConfig{Queue: chat.QueueName(chat.Consumers), Prefix: h.Prefix,
		ReplicaAcks: 1, ReplicaAckTimeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := acked.Add(ctx, redisq.Job{ID: "acl-check-acked", Name: "noop", Payload: []byte("{}")}); !errors.Is(err, redisq.ErrNotReplicated) {
		t.Errorf("add waiting for a replica: %v; want ErrNotReplicated", err)
	}
	trimmer, err := redisq.NewConsumer(rdb, &redisq.ConsumerConfig{Queue: chat.QueueName(chat.Workers), Prefix: h.Prefix,
		Group: "acl-check", Consumer: "acl-check"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := trimmer.Trim(ctx); err != nil {
		t.Errorf("trim of its inbound stream: %v", err)
	}
	fake, err := redisq.NewPublisher(rdb, &redisq.PublisherConfig{Queue: chat.QueueName(chat.Workers), Prefix: h.Prefix})
	if err != nil {
		t.Fatal(err)
	}
	_, err = fake.Add(ctx, redisq.Job{ID: "forged", Name: chat.EventMessageCreated, Payload: []byte("{}")})
	denied("Publisher.Add to workers' queue", err)

	// The worker dead-letters (and caps the dead-letter stream) and the
	// gauges read the queue with these credentials: a malformed entry put
	// on the stream consumers reads (by the admin) is dead-lettered and
	// counted.
	if err := admin.XAdd(ctx, &redis.XAddArgs{Stream: in.Stream, Values: []any{"garbage", "x"}}).Err(); err != nil {
		t.Fatal(err)
	}
	var m string
	testenv.WaitFor(t, 30*time.Second, "the malformed entry dead-lettered and in consumers' gauges", func() bool {
		m, err = chattest.Get(cons.base + "/metrics")
		ok := err == nil && strings.Contains(m, "outboxchat_deadletter_entries 1") && strings.Contains(m, "outboxchat_queue_pending 0")
		if !ok && testing.Verbose() {
			for _, l := range strings.Split(m, "\n") {
				if strings.HasPrefix(l, "outboxchat_queue") || strings.HasPrefix(l, "outboxchat_dead") {
					t.Log(l)
				}
			}
		}
		return ok
	})
	if qi, err := redisq.Inspect(ctx, rdb, h.Prefix, chat.QueueName(chat.Workers)); err != nil || qi.DeadLetters != 1 || len(qi.Groups) != 1 {
		t.Errorf("Inspect with consumers' credentials = %+v, %v", qi, err)
	}
}

// withRedisUser returns redisURL with user's credentials (password
// "pw-"+user, as the ACL tests set it).
func withRedisUser(t *testing.T, redisURL, user string) string {
	t.Helper()
	u, err := url.Parse(redisURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(user, "pw-"+user)
	return u.String()
}

// sendThreeEachWay starts both services, each on its Redis URL in urls,
// sends three messages each way in chatID and waits for both sockets to
// show them: the services' Redis rights are enough. It returns the
// running services.
func sendThreeEachWay(t *testing.T, h *harness, urls map[string]string, chatID int64) (cons, work *running) {
	t.Helper()
	cons = h.start(chat.Consumers, func(c *Config) { c.RedisURL = urls[chat.Consumers] })
	work = h.start(chat.Workers, func(c *Config) { c.RedisURL = urls[chat.Workers] })
	wc, ww := chattest.Watch(t, cons.base, chatID), chattest.Watch(t, work.base, chatID)
	for range 3 {
		chattest.Send(t, cons.base, chatID, "to workers")
		chattest.Send(t, work.base, chatID, "to consumers")
	}
	ww.WaitSeqs(t, chat.Consumers, 3, 20*time.Second)
	wc.WaitSeqs(t, chat.Workers, 3, 20*time.Second)
	return cons, work
}
