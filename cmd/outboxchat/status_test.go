package main

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/presence"
	"github.com/outboxchat/outboxchat/chat/status"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/redisq"
)

// status names a non-durable Redis, a consumer name two live processes
// share and a relay that is not listening, each a problem (exit 1), and is
// healthy again once each is mended.
func TestStatusNamesDurabilitySharedNameAndListening(t *testing.T) {
	ctx := context.Background()
	dbURL, admin := migratedDatabase(t)
	srv := testenv.PrivateRedis(t)
	rdb, err := redisq.NewClient(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	prefix := testenv.Prefix(t)
	conn := []string{"--database-url", dbURL, "--redis-url", srv.URL(), "--redis-prefix", prefix}

	if err := rdb.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	queue := chat.QueueName(chat.Consumers) // the stream workers read
	var ps []*presence.Process
	for range 2 {
		p, err := presence.New(rdb, prefix, queue, chat.Workers, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Beat(ctx, "workers-same"); err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	if _, err := admin.Exec(ctx, `INSERT INTO consumers.relay_heartbeat (relay, pass_at, listening) VALUES ('consumers-a', now(), false)`); err != nil {
		t.Fatal(err)
	}

	out, err := runCmd(t, append([]string{"status", "--json"}, conn...)...)
	if !errors.Is(err, errNeedsPerson) {
		t.Fatalf("status = %v; want errNeedsPerson (exit 1):\n%s", err, out)
	}
	var st status.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status --json: %v: %s", err, out)
	}
	joined := strings.Join(st.Problems, "\n")
	for _, want := range []string{`NOT DURABLE: appendonly "yes", maxmemory-policy "allkeys-lru"`, `consumer name "workers-same" is used by 2 live processes`, "relay consumers-a is not listening"} {
		if !strings.Contains(joined, want) {
			t.Errorf("problems lack %q:\n%s", want, joined)
		}
	}
	if len(st.Problems) != 3 || len(st.Redis) != 1 || st.Redis[0].Durable == nil || *st.Redis[0].Durable ||
		len(st.Services[1].SharedConsumerNames) != 1 || len(st.Services[1].LiveConsumers) != 2 ||
		len(st.Services[0].Relays) != 1 || st.Services[0].Relays[0].Listening == nil {
		t.Fatalf("status %s", out)
	}
	for _, key := range []string{`"service"`, `"unsent"`, `"oldest_unsent_seconds"`, `"parked"`, `"stream_pending"`, `"dead_letters"`, `"problems"`} {
		if !strings.Contains(out, key) {
			t.Errorf("status --json lacks %s", key)
		}
	}
	text, err := runCmd(t, append([]string{"status"}, conn...)...)
	if !errors.Is(err, errNeedsPerson) || !strings.Contains(text, "NEEDS A PERSON (3)") || !strings.Contains(text, "NOT LISTENING") {
		t.Fatalf("status text = %v:\n%s", err, text)
	}

	if err := rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := ps[1].Leave(ctx, "workers-same"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `UPDATE consumers.relay_heartbeat SET listening = true`); err != nil {
		t.Fatal(err)
	}
	if text, err := runCmd(t, append([]string{"status"}, conn...)...); err != nil || !strings.Contains(text, "healthy") {
		t.Fatalf("status after mending = %v:\n%s", err, text)
	}
}

// status reads a Redis Cluster through a redis+cluster:// URL: every
// master's durability, and the queues and live consumers.
func TestStatusOnRedisCluster(t *testing.T) {
	ctx := context.Background()
	dbURL, _ := migratedDatabase(t)
	cl := testenv.RedisCluster(t, 3)
	rdb, err := redisq.NewClient(cl.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	prefix := testenv.Prefix(t)
	p, err := presence.New(rdb, prefix, chat.QueueName(chat.Consumers), chat.Workers, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Beat(ctx, "workers-a"); err != nil {
		t.Fatal(err)
	}
	out, err := runCmd(t, "status", "--json", "--database-url", dbURL, "--redis-url", cl.URL(), "--redis-prefix", prefix)
	if err != nil {
		t.Fatalf("status = %v:\n%s", err, out)
	}
	var st status.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status --json: %v: %s", err, out)
	}
	var addrs []string
	for _, n := range st.Redis {
		if n.Durable == nil || !*n.Durable {
			t.Errorf("node %+v not durable", n)
		}
		addrs = append(addrs, n.Addr)
	}
	want := cl.Addrs()
	slices.Sort(addrs)
	slices.Sort(want)
	if !slices.Equal(addrs, want) {
		t.Fatalf("status read nodes %v, want the 3 masters %v", addrs, want)
	}
	if len(st.Services) != 2 || len(st.Services[1].LiveConsumers) != 1 {
		t.Fatalf("status %s", out)
	}
}

// The summary row of a service with partitions names partition 0's stream
// and says how many more its sums cover; without partitions it names the
// stream alone.
func TestStatusSummaryRowNamesThePartitions(t *testing.T) {
	t.Parallel()
	st := &status.Status{Services: []status.ServiceStatus{
		{Service: chat.Consumers, Stream: "oc:w:stream", StreamLength: 7,
			Partitions: []status.PartitionStatus{{Partition: 0, Stream: "oc:w:stream"}, {Partition: 1, Stream: "oc:w:p1:stream"}, {Partition: 2, Stream: "oc:w:p2:stream"}}},
		{Service: chat.Workers, Stream: "oc:c:stream", Partitions: []status.PartitionStatus{{Partition: 0, Stream: "oc:c:stream"}}},
	}}
	var b strings.Builder
	writeStatus(&b, st)
	out := b.String()
	if !strings.Contains(out, "oc:w:stream (+2 partitions)") {
		t.Fatalf("consumers' summary row does not say its sums cover 2 more partitions:\n%s", out)
	}
	if strings.Contains(out, "oc:c:stream (+") {
		t.Fatalf("workers' summary row names partitions it does not have:\n%s", out)
	}
	if !strings.Contains(out, "consumers partition 2: ") {
		t.Fatalf("no line for consumers' partition 2:\n%s", out)
	}
}

// Without the queue's figures (no --redis-url, Redis or NATS down) the
// text shows them as "-", not 0: a stream nobody read is not empty. The
// database's figures are shown as read.
func TestStatusTextShowsUnreadQueueFiguresAsUnknown(t *testing.T) {
	t.Parallel()
	parts := []status.PartitionStatus{{Partition: 0, Stream: "oc:w:stream"}, {Partition: 1, Stream: "oc:w:p1:stream"}}
	st := &status.Status{Services: []status.ServiceStatus{
		{Service: chat.Consumers, Unsent: 3, Parked: 2, Stream: "oc:w:stream", Partitions: parts, Errors: []string{"redis: no --redis-url"}},
		{Service: chat.Workers, Unsent: 1, Stream: "oc:c:stream", Errors: []string{"nats: connection refused"}},
	}}
	var b strings.Builder
	writeStatus(&b, st)
	out := b.String()
	rows := map[string][]string{} // service → its summary row's columns
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) >= 10 && f[1] != "partition" {
			rows[f[0]] = f
		}
	}
	for svc, unsent := range map[string]string{chat.Consumers: "3", chat.Workers: "1"} {
		f := rows[svc]
		if f == nil {
			t.Fatalf("no summary row for %s:\n%s", svc, out)
		}
		// Its last four figures are the queue's.
		if tail := f[len(f)-4:]; !slices.Equal(tail, []string{"-", "-", "-", "-"}) {
			t.Errorf("%s summary row ends %q, want - - - - (not read):\n%s", svc, tail, out)
		}
		if f[1] != unsent {
			t.Errorf("%s summary row: unsent %q, want %s (the database was read):\n%s", svc, f[1], unsent, out)
		}
	}
	if !strings.Contains(out, "consumers partition 1: unsent 0 (oldest 0.0s), stream oc:w:p1:stream pending - lag -, relay") {
		t.Errorf("consumers' partition line shows figures not read:\n%s", out)
	}
}

// Without --redis-url, status cannot tell whether a service is drained:
// its text says so ("drained: unknown (Redis not read)", not false), and
// its error points at the list the report has: the text's NEEDS A PERSON,
// the JSON's "problems" (where drained is false and errors says why).
func TestStatusWithoutRedisSaysDrainedUnknown(t *testing.T) {
	dbURL, _ := migratedDatabase(t)
	t.Setenv("REDIS_URL", "")
	t.Setenv("BROKER_URL", "")

	text, err := runCmd(t, "status", "--database-url", dbURL)
	if !errors.Is(err, errNeedsPerson) || !strings.Contains(err.Error(), "NEEDS A PERSON") {
		t.Fatalf("status = %v; want errNeedsPerson naming NEEDS A PERSON:\n%s", err, text)
	}
	for _, want := range []string{"consumers drained: unknown (Redis not read)\n", "workers drained: unknown (Redis not read)\n", "NEEDS A PERSON (",
		// Where the URL may come from: the flag or the environment.
		"  - consumers: cannot read: redis: no --redis-url (or REDIS_URL)\n"} {
		if !strings.Contains(text, want) {
			t.Errorf("status: no %q in\n%s", want, text)
		}
	}
	if strings.Contains(text, "drained: false") {
		t.Errorf("status says drained: false without reading Redis:\n%s", text)
	}

	out, err := runCmd(t, "status", "--json", "--database-url", dbURL)
	if !errors.Is(err, errNeedsPerson) || !strings.Contains(err.Error(), `"problems"`) {
		t.Fatalf("status --json = %v; want errNeedsPerson naming \"problems\"", err)
	}
	var st status.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status --json: %v: %s", err, out)
	}
	for _, s := range st.Services {
		if s.Drained || !slices.Equal(s.NotRead(), []string{"redis"}) {
			t.Errorf("status --json: %s: drained %v, not read %q; want false, [redis]", s.Service, s.Drained, s.NotRead())
		}
	}
}
