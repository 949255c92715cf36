package redisq_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/internal/redisproc"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/redisq"
)

// replyCounter is a node hook counting the TRYAGAIN and ASK replies one
// client received.
type replyCounter struct{ tryAgain, ask atomic.Int64 }

func (r *replyCounter) note(cmds ...redis.Cmder) {
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			switch {
			case strings.HasPrefix(err.Error(), "TRYAGAIN"):
				r.tryAgain.Add(1)
			case strings.HasPrefix(err.Error(), "ASK "):
				r.ask.Add(1)
			}
		}
	}
}

func (r *replyCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *replyCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		r.note(cmd)
		return err
	}
}

func (r *replyCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		r.note(cmds...)
		return err
	}
}

// clusterClient is NewClient on c's URL, closed when the test ends, with
// a replyCounter on every node.
func clusterClient(t *testing.T, c *redisproc.Cluster) (*redis.ClusterClient, *replyCounter) {
	t.Helper()
	u, err := redisq.NewClient(c.URL())
	if err != nil {
		t.Fatal(err)
	}
	cc, ok := u.(*redis.ClusterClient)
	if !ok {
		t.Fatalf("NewClient(%s) = %T, want *redis.ClusterClient", c.URL(), u)
	}
	t.Cleanup(func() { _ = cc.Close() })
	rc := &replyCounter{}
	cc.OnNewNode(func(n *redis.Client) { n.AddHook(rc) })
	return cc, rc
}

// txCounter counts the TRYAGAIN errors of its MULTI/EXEC transactions,
// which go-redis follows without setting them on the commands the node
// hooks see.
type txCounter struct {
	*redis.ClusterClient
	rc *replyCounter
}

func (c txCounter) TxPipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error) {
	cmds, err := c.ClusterClient.TxPipelined(ctx, fn)
	if err != nil && strings.HasPrefix(err.Error(), "TRYAGAIN") {
		c.rc.tryAgain.Add(1)
	}
	return cmds, err
}

// nodeClient is a plain client of one node, closed when the test ends.
func nodeClient(t *testing.T, s *redisproc.Server) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// replicaClient is a client of cluster replica s that reads its own data
// (READONLY on every connection) instead of redirecting to its master.
func replicaClient(t *testing.T, s *redisproc.Server) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1,
		OnConnect: func(ctx context.Context, cn *redis.Conn) error { return cn.ReadOnly(ctx).Err() }})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// clusterCfg is the consumer config of the cluster tests: trims only when
// asked (Trim), short blocking reads.
func clusterCfg(name string) *redisq.ConsumerConfig {
	return &redisq.ConsumerConfig{Queue: "chat", Group: "workers", Consumer: name,
		Block: 20 * time.Millisecond, TrimInterval: time.Hour}
}

func newClusterConsumer(t *testing.T, rdb redis.UniversalClient, prefix, name string) *redisq.Consumer {
	t.Helper()
	cfg := clusterCfg(name)
	cfg.Prefix = prefix
	c, err := redisq.NewConsumer(rdb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// clusterQueue returns a NewClient client of cl, the test's key prefix
// and a publisher of the queue "chat" under it.
func clusterQueue(t *testing.T, cl *redisproc.Cluster) (*redis.ClusterClient, string, *redisq.Publisher) {
	t.Helper()
	rdb, _ := clusterClient(t, cl)
	prefix := testenv.Prefix(t)
	return rdb, prefix, newClusterPublisher(t, rdb, prefix)
}

func newClusterPublisher(t *testing.T, rdb redis.UniversalClient, prefix string) *redisq.Publisher {
	t.Helper()
	p, err := redisq.NewPublisher(rdb, &redisq.PublisherConfig{Queue: "chat", Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// streamJobs counts the stream's entries per job id.
func streamJobs(t *testing.T, rdb redis.UniversalClient, stream string) map[string]int {
	t.Helper()
	msgs, err := rdb.XRange(context.Background(), stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, m := range msgs {
		id, _ := m.Values["id"].(string)
		out[id]++
	}
	return out
}

// Every queue operation works through the cluster client of a
// redis+cluster:// URL: add (a duplicate too), fetch, ack, trim with the
// dedupe marks, dead-letter, replay, re-add and the delete of idle consumers; the
// queue's keys all live on the one node that serves their slot.
func TestClusterQueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cl := testenv.RedisCluster(t, 3)
	rdb, prefix, pub := clusterQueue(t, cl)
	cons := newClusterConsumer(t, rdb, prefix, "w1")
	k := pub.Keys()

	if n, err := pub.Add(ctx, jobs(5, 0)...); err != nil || n != 5 {
		t.Fatalf("Add = %d, %v; want 5", n, err)
	}
	if n, err := pub.Add(ctx, jobs(2, 0)...); err != nil || n != 0 {
		t.Fatalf("Add of duplicates = %d, %v; want 0", n, err)
	}
	ds := fetchN(t, cons, 5)
	if got := ids(ds); !slices.Equal(got, ids(deliveriesOf(jobs(5, 0)))) {
		t.Fatalf("fetched %v", got)
	}
	if err := cons.Ack(ctx, ds[0].StreamID, ds[1].StreamID); err != nil {
		t.Fatal(err)
	}
	if err := cons.DeadLetter(ctx, ds[2], "poison"); err != nil {
		t.Fatal(err)
	}
	if n, err := cons.Trim(ctx); err != nil || n != 3 {
		t.Fatalf("Trim = %d, %v; want 3 (two acked, one dead-lettered)", n, err)
	}
	for i, want := range []bool{false, false, false, true, true} {
		if got := markTTL(t, rdb, k, ds[i].ID) > 0; got != want {
			t.Fatalf("dedupe mark of %s live = %v, want %v", ds[i].ID, got, want)
		}
	}
	dls, err := redisq.NewDeadLetters(rdb, prefix, "chat", 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	list, err := dls.List(ctx, "", 0)
	if err != nil || len(list) != 1 {
		t.Fatalf("dead letters %v, %v; want 1", list, err)
	}
	if out, err := dls.Replay(ctx, list[0].DeadID, list[0].DeadID); err != nil || out[0] == "" || out[1] != "" {
		t.Fatalf("Replay = %q, %v; want a new id, then none", out, err)
	}
	if markTTL(t, rdb, k, ds[2].ID) <= 0 {
		t.Fatal("replay did not set the dedupe mark")
	}
	if n, err := pub.Readd(ctx, jobs(1, 3)...); err != nil || n != 1 {
		t.Fatalf("Readd = %d, %v; want 1", n, err)
	}
	if got, want := streamJobs(t, rdb, k.Stream), map[string]int{"job-2": 1, "job-3": 2, "job-4": 1}; !maps.Equal(got, want) {
		t.Fatalf("stream jobs %v, want %v", got, want)
	}

	if gone, err := redisq.DeleteIdleConsumers(ctx, rdb, prefix, "chat", "workers", 0, []string{"w1"}); err != nil || len(gone) != 0 {
		t.Fatalf("DeleteIdleConsumers = %v, %v; want none (w1 is kept)", gone, err)
	}

	owner, slot, err := cl.NodeFor(ctx, k.Stream)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{k.Stream, k.Dead, k.Presence, k.Dedupe, k.DedupeTokens} {
		if s := rdb.ClusterKeySlot(ctx, key).Val(); int(s) != slot {
			t.Fatalf("key %s in slot %d, the stream in %d", key, s, slot)
		}
	}
	n, err := nodeClient(t, owner).ClusterCountKeysInSlot(ctx, slot).Result()
	if err != nil || n < 4 {
		t.Fatalf("owner %s holds %d keys of slot %d, %v", owner.Addr(), n, slot, err)
	}

	// The durability check reads every node and names the unsafe one.
	var logs testenv.SyncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	if err := redisq.CheckDurability(ctx, rdb, logger); err != nil || logs.String() != "" {
		t.Fatalf("CheckDurability on a durable cluster = %v, logged %q", err, logs.String())
	}
	bad := cl.Nodes[2]
	if err := nodeClient(t, bad).ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	err = redisq.CheckDurability(ctx, rdb, logger)
	if !errors.Is(err, redisq.ErrNotDurable) || strings.Count(logs.String(), "NOT DURABLE") != 1 ||
		!strings.Contains(logs.String(), "node="+bad.Addr()) {
		t.Fatalf("CheckDurability with %s on allkeys-lru = %v, logged %q", bad.Addr(), err, logs.String())
	}
}

func deliveriesOf(js []redisq.Job) []redisq.Delivery {
	out := make([]redisq.Delivery, len(js))
	for i, j := range js {
		out[i] = redisq.Delivery{Job: j}
	}
	return out
}

// slotMove is a redisproc.SlotMove of a test: its steps fail the test on
// error.
type slotMove struct {
	*redisproc.SlotMove
	t  *testing.T
	cl *redisproc.Cluster
}

// startSlotMove starts moving key's slot from its owner to the next node.
func startSlotMove(t *testing.T, cl *redisproc.Cluster, key string) *slotMove {
	t.Helper()
	from, slot, err := cl.NodeFor(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	to := cl.Nodes[(slices.Index(cl.Nodes, from)+1)%len(cl.Nodes)]
	sm, err := cl.StartSlotMove(context.Background(), slot, to)
	if err != nil {
		t.Fatal(err)
	}
	return &slotMove{SlotMove: sm, t: t, cl: cl}
}

func (m *slotMove) migrate(keys ...string) {
	m.t.Helper()
	if err := m.Migrate(context.Background(), keys...); err != nil {
		m.t.Fatal(err)
	}
}

func (m *slotMove) migrateRest() {
	m.t.Helper()
	if err := m.MigrateRest(context.Background()); err != nil {
		m.t.Fatal(err)
	}
}

func (m *slotMove) finish() {
	m.t.Helper()
	if err := m.Finish(context.Background()); err != nil {
		m.t.Fatal(err)
	}
}

// migrationOp is one queue operation run during a slot move, on a
// client of its own.
type migrationOp struct {
	name string
	rc   *replyCounter
	done chan error
}

// during runs f on a new cluster client and returns once f returned or
// its client got a TRYAGAIN (f is then retrying: its keys are split
// between the two nodes), so that every operation has met the slot move
// before the move goes on.
func (m *slotMove) during(name string, f func(rdb redis.UniversalClient) error) *migrationOp {
	m.t.Helper()
	rdb, rc := clusterClient(m.t, m.cl)
	op := &migrationOp{name: name, rc: rc, done: make(chan error, 1)}
	go func() { op.done <- f(txCounter{rdb, rc}) }()
	testenv.WaitFor(m.t, 10*time.Second, name+" returned or met TRYAGAIN", func() bool {
		return len(op.done) > 0 || rc.tryAgain.Load() > 0
	})
	return op
}

// wait waits for op's result; blocked tells whether it must have met
// TRYAGAIN.
func (op *migrationOp) wait(t *testing.T, blocked bool) {
	t.Helper()
	select {
	case err := <-op.done:
		if err != nil {
			t.Fatalf("%s: %v", op.name, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not return", op.name)
	}
	if got := op.rc.tryAgain.Load() > 0; got != blocked {
		t.Fatalf("%s met TRYAGAIN: %v, want %v", op.name, got, blocked)
	}
}

// Every script, and the dead-letter transaction, runs while its queue's
// slot moves to another master, at each step of the move: before any key
// moved, with only the stream moved, and with every key moved but the
// slot not yet handed over. Operations whose keys are on one node run at
// once (through ASK when they moved), the add of a new job too (its dedupe
// mark goes into keys that exist before the move); the others meet
// TRYAGAIN and retry until their keys are together again. At the end
// nothing is lost and no entry was added twice.
func TestClusterScriptsDuringSlotMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cl := testenv.RedisCluster(t, 3)
	rdb, prefix, pub := clusterQueue(t, cl)
	k := pub.Keys()
	w1 := newClusterConsumer(t, rdb, prefix, "w1")
	pub0 := func(f func(p *redisq.Publisher) error) func(redis.UniversalClient) error {
		return func(r redis.UniversalClient) error { return f(newClusterPublisher(t, r, prefix)) }
	}
	added := func(want int, f func(p *redisq.Publisher) (int, error)) func(redis.UniversalClient) error {
		return pub0(func(p *redisq.Publisher) error {
			n, err := f(p)
			if err == nil && n != want {
				err = fmt.Errorf("added %d, want %d", n, want)
			}
			return err
		})
	}

	// Before the move: j0…j5 added and fetched by w1; j0 and j1 acked, j2
	// dead-lettered; j3, j4, j5 pending; w1 present.
	if _, err := pub.Add(ctx, jobs(6, 0)...); err != nil {
		t.Fatal(err)
	}
	ds := fetchN(t, w1, 6)
	if err := w1.Ack(ctx, ds[0].StreamID, ds[1].StreamID); err != nil {
		t.Fatal(err)
	}
	if err := w1.DeadLetter(ctx, ds[2], "poison"); err != nil {
		t.Fatal(err)
	}
	// The presence set, kept by the application (chat/presence), is one
	// of the queue's keys: it moves with the slot.
	if err := rdb.ZAdd(ctx, k.Presence, redis.Z{Score: math.MaxInt32, Member: "workers\x00w1\x00i"}).Err(); err != nil {
		t.Fatal(err)
	}
	dead, err := rdb.XRange(ctx, k.Dead, "-", "+").Result()
	if err != nil || len(dead) != 1 {
		t.Fatalf("dead letters %v, %v", dead, err)
	}

	m := startSlotMove(t, cl, k.Stream)
	// trims is a trim by w1 that must delete want entries.
	trims := func(want int64) func(redis.UniversalClient) error {
		return func(r redis.UniversalClient) error {
			n, err := newClusterConsumer(t, r, prefix, "w1").Trim(ctx)
			if err == nil && n != want {
				err = fmt.Errorf("trimmed %d, want %d", n, want)
			}
			return err
		}
	}

	// Step 1: nothing moved yet.
	m.during("add j6 (new)", added(1, func(p *redisq.Publisher) (int, error) { return p.Add(ctx, jobs(1, 6)...) })).wait(t, false)
	m.during("add j3 (duplicate)", added(0, func(p *redisq.Publisher) (int, error) { return p.Add(ctx, jobs(1, 3)...) })).wait(t, false)
	m.during("readd j4", added(1, func(p *redisq.Publisher) (int, error) { return p.Readd(ctx, jobs(1, 4)...) })).wait(t, false)
	m.during("trim j0-j2", trims(3)).wait(t, false)

	// Step 2: only the stream moved.
	m.migrate(k.Stream)
	replay := m.during("replay j2", func(r redis.UniversalClient) error {
		d, err := redisq.NewDeadLetters(r, prefix, "chat", 0, nil)
		if err != nil {
			return err
		}
		out, err := d.Replay(ctx, dead[0].ID)
		if err == nil && out[0] == "" {
			err = errors.New("replayed nothing")
		}
		return err
	})
	m.during("ack j5", func(r redis.UniversalClient) error {
		return newClusterConsumer(t, r, prefix, "w1").Ack(ctx, ds[5].StreamID)
	}).wait(t, false)
	deadJ3 := m.during("dead-letter j3", func(r redis.UniversalClient) error {
		return newClusterConsumer(t, r, prefix, "w1").DeadLetter(ctx, ds[3], "poison")
	})
	// The delete of idle consumers declares the stream alone: it runs at
	// once, through ASK.
	m.during("delete idle consumers", func(r redis.UniversalClient) error {
		gone, err := redisq.DeleteIdleConsumers(ctx, r, prefix, "chat", "workers", 0, nil)
		if err == nil && len(gone) != 0 {
			err = fmt.Errorf("deleted %v, want none (w1 has pending entries)", gone)
		}
		return err
	}).wait(t, false)
	readdJ4 := m.during("readd j4 again", added(1, func(p *redisq.Publisher) (int, error) { return p.Readd(ctx, jobs(1, 4)...) }))

	// Step 3: every key moved, the slot not handed over. The operations
	// whose keys are all on the target now run there.
	m.migrateRest()
	deadJ3.wait(t, true)
	readdJ4.wait(t, true)
	replay.wait(t, true)
	m.during("add j7 (new)", added(1, func(p *redisq.Publisher) (int, error) { return p.Add(ctx, jobs(1, 7)...) })).wait(t, false)
	m.during("readd j5", added(1, func(p *redisq.Publisher) (int, error) { return p.Readd(ctx, jobs(1, 5)...) })).wait(t, false)
	m.during("trim j3", trims(1)).wait(t, false)
	m.during("fetch w2", func(r redis.UniversalClient) error {
		got, err := newClusterConsumer(t, r, prefix, "w2").Fetch(ctx, 100)
		// The replay of j2 and the second re-add of j4 both waited for
		// the move: their order is the one they retried in.
		fetched := slices.Sorted(slices.Values(ids(got)))
		if err == nil && !slices.Equal(fetched, []string{"job-2", "job-4", "job-4", "job-5", "job-6", "job-7"}) {
			err = fmt.Errorf("fetched %v, want j6, j4, j2 and j4 (in either order), j7, j5", ids(got))
		}
		return err
	}).wait(t, false)

	// Step 4: the slot is handed over.
	m.finish()

	want := map[string]int{"job-2": 1, "job-4": 3, "job-5": 2, "job-6": 1, "job-7": 1}
	if got := streamJobs(t, rdb, k.Stream); !maps.Equal(got, want) {
		t.Fatalf("stream jobs %v, want %v", got, want)
	}
	if got, err := rdb.XRange(ctx, k.Dead, "-", "+").Result(); err != nil || len(got) != 1 || got[0].Values["id"] != "job-3" {
		t.Fatalf("dead letters %v, %v; want job-3 alone", got, err)
	}
	for id, want := range map[string]bool{"job-2": true, "job-3": false, "job-4": true, "job-6": true, "job-7": true} {
		if got := markTTL(t, rdb, k, id) > 0; got != want {
			t.Fatalf("dedupe mark of %s live = %v, want %v", id, got, want)
		}
	}
	if n := nodeClient(t, m.From).ClusterCountKeysInSlot(ctx, m.Slot).Val(); n != 0 {
		t.Fatalf("%d keys of slot %d left on the source", n, m.Slot)
	}
	if n := nodeClient(t, m.To).ClusterCountKeysInSlot(ctx, m.Slot).Val(); n != 5 {
		t.Fatalf("%d keys of slot %d on the target, want the queue's 5 (stream, dead letters, presence, dedupe marks and re-add tokens)", n, m.Slot)
	}
}

// A node that answers CLUSTERDOWN (the cluster lost a master) fails the
// call at once: the node gets each command once, no retry, and the error
// matches ErrClusterDown. Once the master is back, the same clients work.
func TestClusterDownFailsFast(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cl, err := redisproc.StartCluster(cctx, 3, &redisproc.Options{ClusterNodeTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	rdb, prefix, pub := clusterQueue(t, cl)
	cons := newClusterConsumer(t, rdb, prefix, "w1")
	if _, err := pub.Add(ctx, jobs(2, 0)...); err != nil {
		t.Fatal(err)
	}
	owner, _, err := cl.NodeFor(ctx, pub.Keys().Stream)
	if err != nil {
		t.Fatal(err)
	}
	var other *redisproc.Server
	for _, s := range cl.Nodes {
		if s != owner {
			other = s
		}
	}
	if err := other.Stop(cctx); err != nil {
		t.Fatal(err)
	}
	if err := cl.WaitState(cctx, "fail"); err != nil {
		t.Fatal(err)
	}
	oc := nodeClient(t, owner)
	downs := func() int64 {
		info := oc.Info(ctx, "errorstats").Val()
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "errorstat_CLUSTERDOWN:count="); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
		return 0
	}
	acked := ackPublisher(t, rdb, prefix)
	for _, c := range []struct {
		name  string
		call  func() error
		downs int64
	}{
		{"add", func() error { _, err := pub.Add(ctx, jobs(3, 2)...); return err }, 1},
		{"readd", func() error { _, err := pub.Readd(ctx, jobs(1, 0)...); return err }, 1},
		{"trim", func() error { _, err := cons.Trim(ctx); return err }, 1},
		{"xlen", func() error { return rdb.XLen(ctx, pub.Keys().Stream).Err() }, 1},
		// The script and the placeholder's HSET, in one pipeline.
		{"add waiting for replicas", func() error { _, err := acked.Add(ctx, jobs(3, 2)...); return err }, 2},
	} {
		before := downs()
		err := c.call()
		if !errors.Is(err, redisq.ErrClusterDown) {
			t.Fatalf("%s: %v, want ErrClusterDown", c.name, err)
		}
		// Each call, Add's of three jobs too, is sent once.
		if got := downs() - before; got != c.downs {
			t.Fatalf("%s: the node answered CLUSTERDOWN %d times, want %d (no retry)", c.name, got, c.downs)
		}
	}

	if err := other.Restart(cctx); err != nil {
		t.Fatal(err)
	}
	if err := cl.WaitState(cctx, "ok"); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "add after the cluster is back", func() bool {
		n, err := pub.Add(ctx, jobs(3, 2)...)
		return err == nil && n == 3
	})
}

// evalAdd runs add.lua by EVAL (not through a Publisher) on q's
// keys, with stream in place of q's stream when not "", for one job id
// with token ("" = add) and a TTL of a minute, and returns its reply.
func evalAdd(t *testing.T, q *queue, stream, token, id string) ([]any, error) {
	t.Helper()
	src, err := os.ReadFile("../internal/queuescript/add.lua")
	if err != nil {
		t.Fatal(err)
	}
	if stream == "" {
		stream = q.keys.Stream
	}
	return q.rdb.Eval(context.Background(), string(src), []string{stream, q.keys.Dedupe, q.keys.DedupeTokens},
		60000, token, id, "message.created", "{}", "", "").Slice()
}

// add.lua in its re-add mode run twice with one token (what a client does
// when it resends a command whose reply it lost) adds the job once and
// counts it both times; a later call, with another token, adds it again.
func TestReaddResendAddsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t, nil)
	run := func(token string) {
		t.Helper()
		r, err := evalAdd(t, q, "", token, "job-1")
		if err != nil || fmt.Sprint(r) != "[1 0 ]" {
			t.Fatalf("add.lua re-add = %v, %v; want [1 0 ] (one added, none failed)", r, err)
		}
	}
	run("call-1")
	run("call-1")
	if n := q.rdb.XLen(ctx, q.keys.Stream).Val(); n != 1 {
		t.Fatalf("stream length %d after a resend, want 1", n)
	}
	run("call-2")
	if n := q.rdb.XLen(ctx, q.keys.Stream).Val(); n != 2 {
		t.Fatalf("stream length %d after a second call, want 2", n)
	}
	if n, err := q.pub.Readd(ctx, jobs(1, 1)...); err != nil || n != 1 {
		t.Fatalf("Readd = %d, %v", n, err)
	}
	if n := q.rdb.XLen(ctx, q.keys.Stream).Val(); n != 3 {
		t.Fatalf("stream length %d after Readd, want 3", n)
	}
	// A re-add whose XADD failed is not counted as added by a resend.
	bad := q.keys.Stream + "-bad"
	if err := q.rdb.Set(ctx, bad, "not a stream", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		r, err := evalAdd(t, q, bad, "call-3", "job-2")
		if err != nil || len(r) != 3 || r[0] != int64(0) || r[1] != int64(1) {
			t.Fatalf("add.lua re-add onto a string key = %v, %v; want job 1 failed, none added", r, err)
		}
	}
}

// add.lua refuses an empty job id itself (the Go side never sends one):
// in either mode it is the failed job, nothing is added, and the marks'
// placeholder keeps its score +inf.
func TestAddScriptRefusesEmptyID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t, nil)
	for _, token := range []string{"", "call-1"} {
		r, err := evalAdd(t, q, "", token, "")
		if err != nil || fmt.Sprint(r) != "[0 1 ERR empty job id]" {
			t.Fatalf("add.lua (token %q) of an empty id = %v, %v; want [0 1 ERR empty job id]", token, r, err)
		}
	}
	if n := q.rdb.XLen(ctx, q.keys.Stream).Val(); n != 0 {
		t.Fatalf("stream length %d, want 0", n)
	}
	if s := q.rdb.ZScore(ctx, q.keys.Dedupe, "").Val(); !math.IsInf(s, 1) {
		t.Fatalf("placeholder score %v, want +inf", s)
	}
}

// Cluster URLs: addresses (port default 6379), user and password, TLS,
// go-redis's own parameters; a database, no address, tls_ca_file without
// TLS and another scheme are refused; NewClient picks the client type by
// scheme.
func TestParseClusterURL(t *testing.T) {
	t.Parallel()
	o, err := redisq.ParseClusterURL("redis+cluster://u:p%40ss@h1:7000,h2,[::1]:7002,[::2]/?dial_timeout=2s")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"h1:7000", "h2:6379", "[::1]:7002", "[::2]:6379"}; !slices.Equal(o.Addrs, want) {
		t.Fatalf("Addrs %v, want %v", o.Addrs, want)
	}
	if o.Username != "u" || o.Password != "p@ss" || o.DialTimeout != 2*time.Second || o.TLSConfig != nil {
		t.Fatalf("user %q password %q dial %v tls %v", o.Username, o.Password, o.DialTimeout, o.TLSConfig)
	}
	ca := testenv.WriteFile(t, "ca.pem", []byte("not a certificate"))
	if _, err := redisq.ParseClusterURL("rediss+cluster://h1:7000?tls_ca_file=" + ca); err == nil ||
		!strings.Contains(err.Error(), "no PEM certificate") {
		t.Fatalf("a bad tls_ca_file: %v", err)
	}
	o, err = redisq.ParseClusterURL("rediss+cluster://h1:7000/0")
	if err != nil || o.TLSConfig == nil || o.TLSConfig.ServerName != "h1" {
		t.Fatalf("rediss+cluster: %+v, %v", o, err)
	}
	for _, bad := range []string{
		"redis+cluster://h1:7000/1",
		"redis+cluster:///",
		"redis+cluster://h1:7000/?tls_ca_file=/x.pem",
		"redis+cluster://h1:7000/?no_such_param=1",
		"redis://h1:7000",
	} {
		if _, err := redisq.ParseClusterURL(bad); err == nil {
			t.Errorf("ParseClusterURL(%q) succeeded", bad)
		}
	}
	if _, err := redisq.ParseClusterURL("redis+cluster://u:secret@h1:7000/3"); err == nil || strings.Contains(err.Error(), "secret") {
		t.Errorf("error %v: want one without the password", err)
	}
	for url, want := range map[string]string{
		"redis+cluster://127.0.0.1:1/":            "*redis.ClusterClient",
		"redis://127.0.0.1:1/0":                   "*redis.Client",
		"redis+sentinel://127.0.0.1:1/mymaster/0": "*redis.Client",
	} {
		c, err := redisq.NewClient(url)
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprintf("%T", c); got != want {
			t.Errorf("NewClient(%s) = %s, want %s", url, got, want)
		}
		_ = c.Close()
	}
}

// After a master's failover (killed, its replica promoted) the cluster
// client of NewClient finds the promoted replica by itself: its failed
// dials to the dead master make it reload the slots' owners, instead of
// waiting for go-redis's periodic reload (a minute). The wait below is
// well under that minute.
func TestClusterClientFollowsFailover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cl, err := redisproc.StartCluster(cctx, 3, &redisproc.Options{ClusterNodeTimeout: 500 * time.Millisecond, ClusterReplicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	rdb, prefix, pub := clusterQueue(t, cl)
	if _, err := pub.Add(ctx, jobs(2, 0)...); err != nil {
		t.Fatal(err)
	}
	owner, slot, err := cl.NodeFor(ctx, pub.Keys().Stream)
	if err != nil {
		t.Fatal(err)
	}
	f, err := cl.StartFailover(cctx, owner)
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.WaitSynced(cctx); err != nil {
		t.Fatal(err)
	}
	if err := f.KillMaster(cctx); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, "add through the promoted replica", func() bool {
		n, err := pub.Add(ctx, jobs(1, 2)...)
		return err == nil && n == 1
	})
	if n := nodeClient(t, f.Replica).XLen(ctx, pub.Keys().Stream).Val(); n != 3 {
		t.Fatalf("stream on the promoted replica has %d entries, want 3", n)
	}

	// Waiting for a replica: the promoted master has none until the old
	// one rejoins, so an add fails, and succeeds after; the rejoined
	// replica has the entry when Add returns.
	acked := ackPublisher(t, rdb, prefix)
	if counts, err := redisq.ReplicasInSync(ctx, rdb); err != nil || len(counts) != 3 || counts[f.Replica.Addr()] != 0 {
		t.Fatalf("replicas in sync per master after the failover: %v, %v; want 3 masters, %s with 0", counts, err, f.Replica.Addr())
	}
	if _, err := acked.Add(ctx, jobs(1, 3)...); !errors.Is(err, redisq.ErrNotReplicated) {
		t.Fatalf("add waiting for a replica of a master without one: %v; want ErrNotReplicated", err)
	}
	if err := f.Rejoin(cctx); err != nil {
		t.Fatal(err)
	}
	// A rejoined replica counts for WAIT once its master has it online,
	// after its full resync.
	if added := addReplicated(t, acked, jobs(1, 3)); added != 0 {
		t.Fatalf("retry added %d; want 0 (a duplicate)", added)
	}
	if counts, err := redisq.ReplicasInSync(ctx, rdb); err != nil || counts[f.Replica.Addr()] != 1 {
		t.Fatalf("replicas in sync per master after the rejoin: %v, %v; want %s with 1", counts, err, f.Replica.Addr())
	}
	if n, err := acked.Add(ctx, jobs(1, 4)...); err != nil || n != 1 {
		t.Fatalf("add waiting for the rejoined replica: %d, %v", n, err)
	}
	if got := streamJobs(t, replicaClient(t, f.Master), pub.Keys().Stream); len(got) != 5 || got["job-4"] != 1 {
		t.Fatalf("stream on the rejoined replica right after Add: %v; want job-0..job-4", got)
	}

	// The slot moves to another master: once its keys are there, before
	// the move finishes, the source answers ASK, which the add follows;
	// after it, the add's node is the old one until MOVED has the client
	// reload the slots' owners.
	var to *redisproc.Server
	masters, err := cl.Masters(cctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range masters {
		if m != f.Replica {
			to = m
			break
		}
	}
	mv, err := cl.StartSlotMove(cctx, slot, to)
	if err != nil {
		t.Fatal(err)
	}
	if err := mv.MigrateRest(cctx); err != nil {
		t.Fatal(err)
	}
	if n, err := acked.Add(ctx, jobs(1, 5)...); err != nil || n != 1 {
		t.Fatalf("add while the slot's keys are on the importing node: %d, %v", n, err)
	}
	if err := mv.Finish(cctx); err != nil {
		t.Fatal(err)
	}
	if c, err := rdb.MasterForKey(ctx, pub.Keys().Stream); err != nil || c.Options().Addr != f.Replica.Addr() {
		t.Fatalf("before the next add the client has the slot on %v, %v; want the old owner %s", c.Options().Addr, err, f.Replica.Addr())
	}
	if n, err := acked.Add(ctx, jobs(1, 6)...); err != nil || n != 1 {
		t.Fatalf("add after the slot moved: %d, %v", n, err)
	}
	if got := streamJobs(t, nodeClient(t, to), pub.Keys().Stream); len(got) != 7 {
		t.Fatalf("stream on the slot's new master: %v; want job-0..job-6", got)
	}
}
