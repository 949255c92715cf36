package server

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/chat/presence"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/redisq"
)

// Two worker processes left with the default consumer name get different
// names; two given the same name each warn and export
// outboxchat_consumer_name_shared 1, back to 0 once one stops.
func TestConsumerNamesUniqueByDefaultSharedWarned(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	var logs [2]testenv.SyncBuffer
	worker := func(name string, log *testenv.SyncBuffer) func(*Config) {
		return func(c *Config) {
			c.Roles = []string{RoleAPI, RoleWorker}
			c.Worker.ConsumerName = name
			if log != nil {
				c.Logger = slog.New(slog.NewTextHandler(log, nil))
			}
		}
	}
	a, b := h.start(chat.Workers, worker("", nil)), h.start(chat.Workers, worker("", nil))
	ctx := context.Background()
	rdb := testenv.Redis(t)
	live, err := presence.Live(ctx, rdb, h.Prefix, chat.QueueName(chat.Consumers))
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	var names []string
	for _, l := range live {
		names = append(names, l.Name)
	}
	slices.Sort(names)
	if want := []string{"workers-" + host + "-0", "workers-" + host + "-1"}; !slices.Equal(names, want) {
		t.Fatalf("default consumer names %v, want %v", names, want)
	}
	for _, r := range []*running{a, b} {
		if v := scrape(t, r.base, "outboxchat_consumer_name_shared"); v != 0 {
			t.Fatalf("outboxchat_consumer_name_shared with unique names = %v", v)
		}
	}

	c, d := h.start(chat.Workers, worker("workers-same", &logs[0])), h.start(chat.Workers, worker("workers-same", &logs[1]))
	for i, r := range []*running{c, d} {
		testenv.WaitFor(t, 15*time.Second, "both processes see the shared name", func() bool {
			return scrape(t, r.base, "outboxchat_consumer_name_shared") == 1 && strings.Contains(logs[i].String(), "CONSUMER NAME SHARED")
		})
	}
	d.stop()
	testenv.WaitFor(t, 15*time.Second, "the name is no longer shared", func() bool {
		return scrape(t, c.base, "outboxchat_consumer_name_shared") == 0
	})
}

// A Redis that is not durable is named by /readyz (still ready) and by
// outboxchat_redis_durable.
func TestNonDurableRedisIsExposed(t *testing.T) {
	t.Parallel()
	srv := testenv.PrivateRedis(t)
	rdb, err := redisq.NewClient(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	ctx := context.Background()
	if err := rdb.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, srv.URL())
	r := h.start(chat.Workers, nil)
	node := `outboxchat_redis_durable{node="` + srv.Addr() + `"}`
	if v := scrape(t, r.base, node); v != 0 {
		t.Fatalf("%s = %v, want 0", node, v)
	}
	code, body := getStatus(t, r.base+"/readyz")
	var ready struct {
		Status       string   `json:"status"`
		RedisDurable *bool    `json:"redis_durable"`
		Warnings     []string `json:"warnings"`
	}
	if err := json.Unmarshal([]byte(body), &ready); err != nil || code != http.StatusOK || ready.Status != "ready" ||
		ready.RedisDurable == nil || *ready.RedisDurable || len(ready.Warnings) != 1 || !strings.Contains(ready.Warnings[0], "allkeys-lru") {
		t.Fatalf("/readyz = %d %s; want 200 ready, redis_durable false, a warning naming the policy", code, body)
	}
	if err := rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 15*time.Second, "the gauge to show durable", func() bool { return scrape(t, r.base, node) == 1 })
	if _, body := getStatus(t, r.base+"/readyz"); !strings.Contains(body, `"redis_durable":true`) {
		t.Fatalf("/readyz after the fix: %s", body)
	}
}

// A process restarted under its --consumer-name after its predecessor
// died (its presence entry still there, never refreshed) is no clash.
func TestConsumerNameOfDeadPredecessorIsNoClash(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	ctx := context.Background()
	rdb := testenv.Redis(t)
	queue := chat.QueueName(chat.Consumers)
	dead, err := presence.New(rdb, h.Prefix, queue, chat.Workers, 8*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dead.Beat(ctx, "workers-w"); err != nil {
		t.Fatal(err)
	}
	var logs testenv.SyncBuffer
	r := h.start(chat.Workers, func(c *Config) {
		c.Roles = []string{RoleAPI, RoleWorker}
		c.Worker.ConsumerName = "workers-w"
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	// The dead entry expires 8 s after its beat: the process refreshed at
	// start and 5 s later meanwhile, seeing it both times.
	testenv.WaitFor(t, 20*time.Second, "the dead entry to expire", func() bool {
		live, err := presence.Live(ctx, rdb, h.Prefix, queue)
		return err == nil && len(live) == 1 && live[0].Instance != dead.Instance()
	})
	if strings.Contains(logs.String(), "CONSUMER NAME SHARED") {
		t.Fatalf("a dead predecessor was reported as sharing the name:\n%s", logs.String())
	}
	if v := scrape(t, r.base, "outboxchat_consumer_name_shared"); v != 0 {
		t.Fatalf("outboxchat_consumer_name_shared = %v, want 0", v)
	}
}

// --redis-replica-acks on a Redis without replicas: serve warns at start,
// naming the node, and a message sent waits in the outbox (nothing reaches
// the stream) instead of being marked sent.
func TestReplicaAcksWithoutReplicasWarnsAndHoldsRows(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	var logs testenv.SyncBuffer
	cons := h.start(chat.Consumers, func(c *Config) {
		c.RedisReplicaAcks = 1
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	if !strings.Contains(logs.String(), "TOO FEW REPLICAS") || !strings.Contains(logs.String(), "replicas_in_sync=0") {
		t.Fatalf("no warning of the missing replica at start:\n%s", logs.String())
	}
	chattest.Send(t, cons.base, 1, "held")
	testenv.WaitFor(t, 15*time.Second, "the relay's add refused for want of a replica", func() bool {
		return strings.Contains(logs.String(), "add not acknowledged by enough replicas")
	})
	// The message's row is still in the outbox: a published row is deleted.
	if n := h.Count(t, `SELECT count(*) FROM consumers.outbox WHERE event = 'message.created'`); n != 1 {
		t.Fatalf("outbox rows of the message after the refused add: %d; want 1 (not marked sent)", n)
	}
}
