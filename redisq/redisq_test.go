package redisq_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/internal/redisproc"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/redisq"
)

func TestMain(m *testing.M) {
	// A slot move under -race on a loaded 2-core machine can take longer
	// than the 2 s a call retries TRYAGAIN for in production; the migration
	// tests need the calls started during a move to outlast it.
	redisq.SetTryAgainBudget(30 * time.Second)
	testenv.Main(m)
}

// queue is one test's queue on the shared test server.
type queue struct {
	rdb    redis.UniversalClient
	prefix string
	pub    *redisq.Publisher
	keys   redisq.Keys
}

func newQueue(t *testing.T, rdb redis.UniversalClient) *queue {
	t.Helper()
	if rdb == nil {
		rdb = testenv.Redis(t)
	}
	prefix := testenv.Prefix(t)
	pub, err := redisq.NewPublisher(rdb, &redisq.PublisherConfig{Queue: "chat", Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	return &queue{rdb: rdb, prefix: prefix, pub: pub, keys: pub.Keys()}
}

func (q *queue) consumer(t testing.TB, name string, cfg *redisq.ConsumerConfig) *redisq.Consumer {
	t.Helper()
	var c redisq.ConsumerConfig
	if cfg != nil {
		c = *cfg
	}
	c.Queue, c.Prefix, c.Consumer = "chat", q.prefix, name
	if c.Group == "" {
		c.Group = "workers"
	}
	if c.Block == 0 {
		c.Block = 50 * time.Millisecond
	}
	cons, err := redisq.NewConsumer(q.rdb, &c)
	if err != nil {
		t.Fatal(err)
	}
	return cons
}

// privateRedis is a private Redis server of the test's own, which it may
// stop and kill, and a fail-fast client of it (NewClient).
func privateRedis(t *testing.T) (*redisproc.Server, redis.UniversalClient) {
	t.Helper()
	srv := testenv.PrivateRedis(t)
	rdb, err := redisq.NewClient(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	return srv, rdb
}

// add adds jobs(n, from), failing the test on an error.
func (q *queue) add(t testing.TB, n, from int) {
	t.Helper()
	if _, err := q.pub.Add(context.Background(), jobs(n, from)...); err != nil {
		t.Fatalf("add: %v", err)
	}
}

func jobs(n int, from int) []redisq.Job {
	js := make([]redisq.Job, n)
	for i := range js {
		id := strconv.Itoa(from + i)
		js[i] = redisq.Job{ID: "job-" + id, Name: "message.created", Payload: []byte(`{"n":` + id + `}`)}
	}
	return js
}

func ids(ds []redisq.Delivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.ID
	}
	return out
}

func streamIDs(ds []redisq.Delivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.StreamID
	}
	return out
}

// markTTL is how long job id's dedupe mark in k still counts: its score in
// k.Dedupe less the server's clock; 0 when there is none or it has expired.
func markTTL(t testing.TB, rdb redis.Cmdable, k redisq.Keys, id string) time.Duration {
	t.Helper()
	ctx := context.Background()
	exp, err := rdb.ZScore(ctx, k.Dedupe, id).Result()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	return max(0, time.UnixMilli(int64(exp)).Sub(now))
}

func stats(t *testing.T, c *redisq.Consumer) redisq.Stats {
	t.Helper()
	s, err := c.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// fetchN fetches until n deliveries arrived (or the deadline passed).
func fetchN(t *testing.T, c *redisq.Consumer, n int) []redisq.Delivery {
	t.Helper()
	ctx := context.Background()
	var got []redisq.Delivery
	testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("%d deliveries", n), func() bool {
		ds, err := c.Fetch(ctx, n-len(got))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ds...)
		return len(got) >= n
	})
	return got
}

// events is an OnEvent recording totals per kind, in String's format.
type events struct {
	mu sync.Mutex
	n  map[redisq.EventKind]int64
	d  int
}

func (e *events) on(ev redisq.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n == nil {
		e.n = map[redisq.EventKind]int64{}
	}
	e.n[ev.Kind] += ev.N
	e.d += ev.Duplicates
}

// count is the total N of kind.
func (e *events) count(kind redisq.EventKind) int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n[kind]
}

func (e *events) String() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return fmt.Sprintf("added=%d dupes=%d reclaimed=%d trimmed=%d", e.n[redisq.EventAdded], e.d, e.n[redisq.EventReclaimed], e.n[redisq.EventTrimmed])
}

func TestAddTwiceSameIDAddsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t, nil)
	var ev events
	pub, err := redisq.NewPublisher(q.rdb, &redisq.PublisherConfig{Queue: "chat", Prefix: q.prefix, OnEvent: ev.on})
	if err != nil {
		t.Fatal(err)
	}
	q.pub = pub
	j := redisq.Job{ID: "m-1", Name: "message.created", Payload: []byte(`{}`)}

	n, err := q.pub.Add(ctx, j)
	if err != nil || n != 1 {
		t.Fatalf("first Add = %d, %v; want 1, nil", n, err)
	}
	n, err = q.pub.Add(ctx, j)
	if err != nil || n != 0 {
		t.Fatalf("second Add = %d, %v; want 0, nil", n, err)
	}
	// A repeat inside one call is a duplicate too.
	n, err = q.pub.Add(ctx, redisq.Job{ID: "m-2"}, redisq.Job{ID: "m-2"}, j)
	if err != nil || n != 1 {
		t.Fatalf("third Add = %d, %v; want 1, nil", n, err)
	}
	if l := q.rdb.XLen(ctx, q.keys.Stream).Val(); l != 2 {
		t.Fatalf("stream length %d, want 2", l)
	}
	if got := ev.String(); got != "added=2 dupes=3 reclaimed=0 trimmed=0" {
		t.Fatalf("events %s", got)
	}
	ttl := markTTL(t, q.rdb, q.keys, "m-1")
	if ttl <= 23*time.Hour || ttl > redisq.DefaultDedupeTTL {
		t.Fatalf("dedupe mark TTL %v, want about %v", ttl, redisq.DefaultDedupeTTL)
	}
}

// A dedupe mark whose expiry has passed counts as absent: the job is added
// again and its mark renewed for DedupeTTL. The trim deletes expired marks
// whether or not their entries are in the stream, and keeps live ones and
// the placeholder.
func TestExpiredDedupeMarkCountsAsAbsentAndIsTrimmed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t, nil)
	q.add(t, 1, 0) // job-0: live mark, creates the keys
	past := float64(time.Now().Add(-time.Minute).UnixMilli())
	if err := q.rdb.ZAdd(ctx, q.keys.Dedupe, redis.Z{Score: past, Member: "job-0"}, redis.Z{Score: past, Member: "lost"}).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := q.pub.Add(ctx, jobs(1, 0)...); err != nil || n != 1 {
		t.Fatalf("Add over an expired mark = %d, %v; want 1 added", n, err)
	}
	if ttl := markTTL(t, q.rdb, q.keys, "job-0"); ttl <= 23*time.Hour {
		t.Fatalf("renewed mark TTL %v, want about %v", ttl, redisq.DefaultDedupeTTL)
	}
	if n, err := q.pub.Add(ctx, jobs(1, 0)...); err != nil || n != 0 {
		t.Fatalf("Add over the renewed mark = %d, %v; want 0 (a duplicate)", n, err)
	}
	c := q.consumer(t, "w1", nil)
	if _, err := c.Trim(ctx); err != nil {
		t.Fatal(err)
	}
	if err := q.rdb.ZScore(ctx, q.keys.Dedupe, "lost").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("expired mark of a lost entry after the trim: %v, want gone", err)
	}
	if markTTL(t, q.rdb, q.keys, "job-0") <= 0 {
		t.Fatal("the trim deleted a live mark of an entry still queued")
	}
	if n := q.rdb.ZCard(ctx, q.keys.Dedupe).Val(); n != 2 {
		t.Fatalf("%d marks, want 2 (job-0 and the placeholder)", n)
	}
}

func TestAddRejectsEmptyID(t *testing.T) {
	t.Parallel()
	q := newQueue(t, nil)
	n, err := q.pub.Add(context.Background(), redisq.Job{ID: "a"}, redisq.Job{})
	if !errors.Is(err, redisq.ErrInvalidJob) || n != 0 {
		t.Fatalf("Add = %d, %v; want 0, ErrInvalidJob", n, err)
	}
	if l := q.rdb.XLen(context.Background(), q.keys.Stream).Val(); l != 0 {
		t.Fatalf("stream length %d, want 0 (nothing sent)", l)
	}
	if n, err := q.pub.Add(context.Background()); n != 0 || err != nil {
		t.Fatalf("empty Add = %d, %v", n, err)
	}
}

func TestAddBulkKeepsOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t, nil)
	js := jobs(500, 0)
	n, err := q.pub.Add(ctx, js...)
	if err != nil || n != 500 {
		t.Fatalf("Add = %d, %v; want 500, nil", n, err)
	}
	// Re-adding the batch with 10 new jobs behind it adds just those.
	n, err = q.pub.Add(ctx, append(js, jobs(10, 500)...)...)
	if err != nil || n != 10 {
		t.Fatalf("re-Add = %d, %v; want 10, nil", n, err)
	}

	c := q.consumer(t, "w1", nil)
	got := fetchN(t, c, 510)
	for i, d := range got {
		if want := "job-" + strconv.Itoa(i); d.ID != want || d.Err != nil {
			t.Fatalf("delivery %d = %q (err %v), want %q", i, d.ID, d.Err, want)
		}
		if want := `{"n":` + strconv.Itoa(i) + `}`; string(d.Payload) != want || d.Name != "message.created" || d.Deliveries != 1 {
			t.Fatalf("delivery %d = %+v", i, d)
		}
	}
}

func TestFetchAckTrims(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t, nil)
	c := q.consumer(t, "w1", &redisq.ConsumerConfig{TrimInterval: time.Millisecond})

	// Nothing queued: Fetch blocks for Block and returns nothing.
	ds, err := c.Fetch(ctx, 10)
	if err != nil || ds != nil {
		t.Fatalf("empty Fetch = %v, %v", ds, err)
	}
	q.add(t, 20, 0)
	got := fetchN(t, c, 20)
	if s := stats(t, c); s.StreamLen != 20 || s.Pending != 20 {
		t.Fatalf("stats after fetch %+v", s)
	}
	if err := c.Ack(ctx, streamIDs(got)...); err != nil {
		t.Fatal(err)
	}
	// The Ack trims: TrimInterval has passed since the consumer was made.
	if s := stats(t, c); s.StreamLen != 0 || s.Pending != 0 {
		t.Fatalf("stats after ack %+v, want empty stream", s)
	}
	// Acked entries are not delivered again.
	if ds, err := c.Fetch(ctx, 10); err != nil || len(ds) != 0 {
		t.Fatalf("Fetch after ack = %v, %v", ds, err)
	}
	// The trim took the dedupe marks with the entries: nothing of the 20
	// jobs is left in Redis but the marks' placeholder.
	if n := q.rdb.ZCard(ctx, q.keys.Dedupe).Val(); n != 1 {
		t.Fatalf("%d dedupe marks after the trim, want 1 (the placeholder)", n)
	}
	if n := q.rdb.HLen(ctx, q.keys.DedupeTokens).Val(); n != 1 {
		t.Fatalf("%d re-add tokens after the trim, want 1 (the placeholder)", n)
	}
	// So a re-add after everyone acknowledged it is a new entry (the
	// receiver's inbox drops it), while an id still queued stays deduped.
	if n, err := q.pub.Add(ctx, jobs(1, 0)...); err != nil || n != 1 {
		t.Fatalf("re-add after trim = %d, %v; want 1 added", n, err)
	}
	if n, err := q.pub.Add(ctx, jobs(1, 0)...); err != nil || n != 0 {
		t.Fatalf("re-add while queued = %d, %v; want 0 added", n, err)
	}
}

// A consumer whose last Ack came before TrimInterval was up trims when a
// later Fetch finds nothing: a drained queue gives its memory back.
func TestIdleFetchTrims(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t, nil)
	c := q.consumer(t, "w1", &redisq.ConsumerConfig{TrimInterval: 300 * time.Millisecond, Block: 100 * time.Millisecond})
	q.add(t, 5, 0)
	got := fetchN(t, c, 5)
	if err := c.Ack(ctx, streamIDs(got)...); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "stream trimmed by idle fetches", func() bool {
		if _, err := c.Fetch(ctx, 10); err != nil {
			t.Fatal(err)
		}
		return stats(t, c).StreamLen == 0 && markTTL(t, q.rdb, q.keys, "job-4") == 0
	})
}

func TestFetchEndsBlockBeforeCtxDeadline(t *testing.T) {
	t.Parallel()
	q := newQueue(t, nil)
	c := q.consumer(t, "w1", &redisq.ConsumerConfig{Block: time.Minute})
	// Without capping BLOCK to the deadline, the read would time out the
	// connection and fail; capped, it is an ordinary empty Fetch.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	ds, err := c.Fetch(ctx, 10)
	if err != nil || ds != nil {
		t.Fatalf("Fetch = %v, %v; want nil, nil", ds, err)
	}
	if _, err := c.Fetch(ctx, 0); err == nil {
		t.Fatal("Fetch with max 0 succeeded")
	}
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	if _, err := c.Fetch(ctx, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("Fetch after cancel: %v", err)
	}
}

func TestTrimWaitsForEveryGroup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t, nil)
	// Trim explicitly, not as a side effect of Ack.
	a := q.consumer(t, "a", &redisq.ConsumerConfig{Group: "ga", TrimInterval: time.Hour})
	b := q.consumer(t, "b", &redisq.ConsumerConfig{Group: "gb", TrimInterval: time.Hour})
	// Both groups exist before anything is added.
	for _, c := range []*redisq.Consumer{a, b} {
		if ds, err := c.Fetch(ctx, 1); err != nil || len(ds) != 0 {
			t.Fatalf("Fetch = %v, %v", ds, err)
		}
	}
	q.add(t, 10, 0)
	trim := func(c *redisq.Consumer, want int64) {
		t.Helper()
		n, err := c.Trim(ctx)
		if err != nil || n != want {
			t.Fatalf("Trim = %d, %v; want %d", n, err, want)
		}
	}
	da := fetchN(t, a, 10)
	if err := a.Ack(ctx, streamIDs(da)...); err != nil {
		t.Fatal(err)
	}
	trim(a, 0) // gb has not read anything yet

	db := fetchN(t, b, 6)                                             // gb: 0..5 delivered
	err := b.Ack(ctx, db[0].StreamID, db[1].StreamID, db[3].StreamID) // 2, 4, 5 pending
	if err != nil {
		t.Fatal(err)
	}
	trim(b, 2) // entries 0 and 1; 2 is still pending on gb
	if err := b.Ack(ctx, db[2].StreamID, db[4].StreamID, db[5].StreamID); err != nil {
		t.Fatal(err)
	}
	trim(b, 4) // 2..5; 6..9 not yet delivered to gb
	db = fetchN(t, b, 4)
	if err := b.Ack(ctx, streamIDs(db)...); err != nil {
		t.Fatal(err)
	}
	trim(b, 4)
	if s := stats(t, a); s.StreamLen != 0 {
		t.Fatalf("stream length %d, want 0", s.StreamLen)
	}
}

func TestStalledDeliveryIsReclaimed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t, nil)
	var ev events
	cfg := &redisq.ConsumerConfig{LockDuration: 200 * time.Millisecond, OnEvent: ev.on}
	dead := q.consumer(t, "dies", cfg)
	live := q.consumer(t, "lives", cfg)

	q.add(t, 1, 0)
	first := fetchN(t, dead, 1) // never acked: "dies" crashed

	var got []redisq.Delivery
	testenv.WaitFor(t, 10*time.Second, "entry reclaimed by the live consumer", func() bool {
		ds, err := live.Fetch(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ds...)
		return len(got) > 0
	})
	if len(got) != 1 || got[0].StreamID != first[0].StreamID || got[0].ID != "job-0" {
		t.Fatalf("reclaimed %+v, want %+v", got, first)
	}
	if got[0].Deliveries != 2 {
		t.Fatalf("Deliveries = %d, want 2", got[0].Deliveries)
	}
	if err := live.Ack(ctx, got[0].StreamID); err != nil {
		t.Fatal(err)
	}
	if s := stats(t, live); s.Pending != 0 {
		t.Fatalf("pending %d after ack", s.Pending)
	}
	if got := ev.String(); got != "added=0 dupes=0 reclaimed=1 trimmed=0" {
		t.Fatalf("events %s", got)
	}
}

func TestRestartedConsumerFinishesOwnPendingFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t, nil)
	q.add(t, 3, 0)
	before := q.consumer(t, "w1", nil)
	pending := fetchN(t, before, 3) // crashes before acking
	q.add(t, 3, 3)

	after := q.consumer(t, "w1", nil) // same name, new process
	ds, err := after.Fetch(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(ids(ds)) != fmt.Sprint(ids(pending)) {
		t.Fatalf("first Fetch after restart = %v, want own pending %v", ids(ds), ids(pending))
	}
	for _, d := range ds {
		if d.Deliveries != 2 {
			t.Fatalf("Deliveries of %s = %d, want 2", d.ID, d.Deliveries)
		}
	}
	if err := after.Ack(ctx, streamIDs(ds)...); err != nil {
		t.Fatal(err)
	}
	ds = fetchN(t, after, 3)
	if want := "[job-3 job-4 job-5]"; fmt.Sprint(ids(ds)) != want {
		t.Fatalf("then %v, want %s", ids(ds), want)
	}
	// Not acking makes the same Consumer hand them out again, first.
	q.add(t, 1, 6)
	again, err := after.Fetch(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(ids(again)) != fmt.Sprint(ids(ds)) {
		t.Fatalf("unsettled deliveries not retried first: got %v, want %v", ids(again), ids(ds))
	}
	if err := after.Ack(ctx, streamIDs(again)...); err != nil {
		t.Fatal(err)
	}
	if ds := fetchN(t, after, 1); ds[0].ID != "job-6" {
		t.Fatalf("then %v, want job-6", ids(ds))
	}
}

func TestMalformedEntryIsReturnedAndDeadLettered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t, nil)
	c := q.consumer(t, "w1", &redisq.ConsumerConfig{TrimInterval: time.Millisecond})
	rawID := q.rdb.XAdd(ctx, &redis.XAddArgs{Stream: q.keys.Stream, Values: []any{"garbage", "x"}}).Val()
	q.add(t, 1, 0)
	ds := fetchN(t, c, 2)
	bad, good := ds[0], ds[1]
	if bad.StreamID != rawID || !errors.Is(bad.Err, redisq.ErrMalformedEntry) || bad.ID != "" {
		t.Fatalf("malformed delivery %+v", bad)
	}
	if good.Err != nil || good.ID != "job-0" {
		t.Fatalf("good delivery %+v", good)
	}
	if err := c.DeadLetter(ctx, bad, "missing fields"); err != nil {
		t.Fatal(err)
	}
	if err := c.Ack(ctx, good.StreamID); err != nil {
		t.Fatal(err)
	}
	// Ack trims at most every TrimInterval (1 ms here), which a loaded
	// machine can make the two acks fall within: trim now.
	if _, err := c.Trim(ctx); err != nil {
		t.Fatal(err)
	}
	if s := stats(t, c); s.DeadLetters != 1 || s.Pending != 0 || s.StreamLen != 0 {
		t.Fatalf("stats %+v", s)
	}
	dead := q.rdb.XRange(ctx, q.keys.Dead, "-", "+").Val()
	if len(dead) != 1 || dead[0].Values["reason"] != "missing fields" || dead[0].Values["stream_id"] != rawID {
		t.Fatalf("dead letters %+v", dead)
	}
	if err := c.DeadLetter(ctx, redisq.Delivery{}, "x"); err == nil {
		t.Fatal("DeadLetter without stream id succeeded")
	}
}

// Trim deletes acknowledged entries that have no job id (no dedupe mark to
// delete with them), also when they are all there is to trim.
func TestTrimDeletesEntriesWithoutID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t, nil)
	c := q.consumer(t, "w1", &redisq.ConsumerConfig{TrimInterval: time.Hour})
	for range 2 {
		if err := q.rdb.XAdd(ctx, &redis.XAddArgs{Stream: q.keys.Stream, Values: []any{"garbage", "x"}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range fetchN(t, c, 2) {
		if err := c.DeadLetter(ctx, d, "missing fields"); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := c.Trim(ctx); err != nil || n != 2 {
		t.Fatalf("Trim = %d, %v; want 2", n, err)
	}
	if n := q.rdb.XLen(ctx, q.keys.Stream).Val(); n != 0 {
		t.Fatalf("stream length %d, want 0", n)
	}
}

// A pending entry deleted from the stream (XDEL) is acked away, counted
// (DeletedPending, EventDeletedPending) and the rest delivered, whether the
// consumer re-reads its own pending entries (XREADGROUP 0 answers the
// deleted one with no fields) or reclaims another consumer's (XAUTOCLAIM
// reports it in its third reply element).
func TestDeletedPendingEntryIsAckedAway(t *testing.T) {
	for _, tc := range []struct{ name, reader string }{{"own pending", "w1"}, {"reclaimed", "live"}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			q := newQueue(t, nil)
			q.add(t, 2, 0)
			var ev events
			cfg := &redisq.ConsumerConfig{LockDuration: 100 * time.Millisecond, OnEvent: ev.on}
			ds := fetchN(t, q.consumer(t, "w1", cfg), 2)
			if err := q.rdb.XDel(ctx, q.keys.Stream, ds[0].StreamID).Err(); err != nil {
				t.Fatal(err)
			}
			c := q.consumer(t, tc.reader, cfg)
			var got []redisq.Delivery
			testenv.WaitFor(t, 10*time.Second, "the live entry delivered again", func() bool {
				ds, err := c.Fetch(ctx, 10)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, ds...)
				return len(got) > 0
			})
			if len(got) != 1 || got[0].ID != "job-1" {
				t.Fatalf("Fetch = %v, want only job-1", ids(got))
			}
			if s := stats(t, c); s.Pending != 1 {
				t.Fatalf("pending %d, want 1 (deleted entry acked away)", s.Pending)
			}
			if c.DeletedPending() != 1 || ev.count(redisq.EventDeletedPending) != 1 {
				t.Fatalf("DeletedPending = %d, EventDeletedPending N = %d; want 1 and 1", c.DeletedPending(), ev.count(redisq.EventDeletedPending))
			}
		})
	}
}

func TestGroupRecreatedAfterDataLoss(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t, nil)
	c := q.consumer(t, "w1", nil)
	q.add(t, 1, 0)
	if err := c.Ack(ctx, streamIDs(fetchN(t, c, 1))...); err != nil {
		t.Fatal(err)
	}
	// As after a restart without AOF: stream, group and dedupe marks gone.
	q.rdb.Del(ctx, q.keys.Stream, q.keys.Dedupe, q.keys.DedupeTokens)
	q.add(t, 1, 1)
	if ds := fetchN(t, c, 1); ds[0].ID != "job-1" {
		t.Fatalf("got %v", ids(ds))
	}
}

func TestRedisDownFailsFastAndBuffersNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, rdb := privateRedis(t)
	q := newQueue(t, rdb)
	c := q.consumer(t, "w1", nil)
	q.add(t, 1, 0)
	if err := srv.Stop(ctx); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	n, err := q.pub.Add(ctx, jobs(1, 1)...)
	took := time.Since(start)
	t.Logf("Add with Redis down failed after %v: %v", took, err)
	if err == nil || n != 0 {
		t.Fatalf("Add with Redis down = %d, %v; want an error", n, err)
	}
	// Fail fast is the contract (not a performance figure): a generous bound.
	if took > 3*time.Second {
		t.Fatalf("Add took %v to fail", took)
	}
	if _, err := c.Fetch(ctx, 10); err == nil {
		t.Fatal("Fetch with Redis down succeeded")
	}
	if err := c.Ack(ctx, "1-1"); err == nil {
		t.Fatal("Ack with Redis down succeeded")
	}

	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	var ds []redisq.Delivery
	testenv.WaitFor(t, 10*time.Second, "fetch after restart", func() bool {
		got, err := c.Fetch(ctx, 10)
		if err == nil {
			err = c.Ack(ctx, streamIDs(got)...)
		}
		ds = append(ds, got...)
		return err == nil && len(got) == 0 && len(ds) > 0
	})
	if fmt.Sprint(ids(ds)) != "[job-0]" {
		t.Fatalf("after restart the stream holds %v; the failed job must not have been buffered", ids(ds))
	}
	// The failed job was not remembered as a duplicate either: a retry adds it.
	// The script cache is empty after the restart (NOSCRIPT path).
	if n, err := q.pub.Add(ctx, jobs(2, 0)...); err != nil || n != 1 {
		t.Fatalf("retry Add = %d, %v; want 1, nil", n, err)
	}
}

func TestKilledRedisKeepsEntriesWithAOF(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, rdb := privateRedis(t)
	if err := rdb.ConfigSet(ctx, "appendfsync", "always").Err(); err != nil {
		t.Fatal(err)
	}
	q := newQueue(t, rdb)
	if n, err := q.pub.Add(ctx, jobs(3, 0)...); err != nil || n != 3 {
		t.Fatalf("Add = %d, %v", n, err)
	}
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	var err error
	testenv.WaitFor(t, 10*time.Second, "Add after restart", func() bool {
		n, err = q.pub.Add(ctx, jobs(3, 0)...)
		return err == nil
	})
	if n != 0 {
		t.Fatalf("re-Add after restart added %d; dedupe marks were lost", n)
	}
	ds := fetchN(t, q.consumer(t, "w1", nil), 3)
	if fmt.Sprint(ids(ds)) != "[job-0 job-1 job-2]" {
		t.Fatalf("after kill -9 and restart got %v", ids(ds))
	}
}

func TestCheckDurability(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, rdb := privateRedis(t)
	var logs testenv.SyncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))

	if err := redisq.CheckDurability(ctx, rdb, logger); err != nil {
		t.Fatalf("durable server: %v", err)
	}
	if logs.String() != "" {
		t.Fatalf("durable server logged %q", logs.String())
	}
	for _, tc := range []struct{ param, value, want string }{
		{"appendonly", "no", "appendonly=no"},
		{"maxmemory-policy", "allkeys-lru", "maxmemory_policy=allkeys-lru"},
	} {
		if err := rdb.ConfigSet(ctx, tc.param, tc.value).Err(); err != nil {
			t.Fatal(err)
		}
		err := redisq.CheckDurability(ctx, rdb, logger)
		var derr *redisq.DurabilityError
		if !errors.Is(err, redisq.ErrNotDurable) || !errors.As(err, &derr) {
			t.Fatalf("%s %s: err %v, want a *DurabilityError", tc.param, tc.value, err)
		}
		if !bytes.Contains([]byte(logs.String()), []byte(tc.want)) || !bytes.Contains([]byte(logs.String()), []byte("level=WARN")) {
			t.Fatalf("%s %s: log %q lacks a warning with %s", tc.param, tc.value, logs.String(), tc.want)
		}
	}
	if err := srv.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := redisq.CheckDurability(ctx, rdb, logger); err == nil || errors.Is(err, redisq.ErrNotDurable) {
		t.Fatalf("server down: err %v, want a connection error", err)
	}
}

// The group vanishes between a fetch and its ack (FLUSHALL) while jobs are
// added to a new stream: the next fetch meets NOGROUP and creates the group
// again from 0 (not $), so the jobs added before it are delivered.
func TestAckNoGroupRecreatesGroupFromZero(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t, nil)
	c := q.consumer(t, "w1", nil)
	q.add(t, 1, 0)
	ds := fetchN(t, c, 1)
	// The stream and group are lost; another publisher adds two jobs to a
	// fresh stream (no group yet) before the ack.
	if err := q.rdb.Del(ctx, q.keys.Stream).Err(); err != nil {
		t.Fatal(err)
	}
	q.add(t, 2, 1)
	// XACK on a stream without the group answers 0 or NOGROUP depending on
	// the server; either way nothing breaks.
	_ = c.Ack(ctx, ds[0].StreamID)
	got := fetchN(t, c, 2)
	if ids(got)[0] != "job-1" || ids(got)[1] != "job-2" {
		t.Fatalf("after the group came back: %v, want job-1, job-2 (created from 0, not $)", ids(got))
	}
}

// Readd adds a job whose dedupe mark is still there (its entry lost), where
// Add would see a duplicate.
func TestReaddGetsPastTheDedupeKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t, nil)
	q.add(t, 1, 0)
	if err := q.rdb.Del(ctx, q.keys.Stream).Err(); err != nil { // entry lost, key kept
		t.Fatal(err)
	}
	if n, err := q.pub.Add(ctx, jobs(1, 0)...); err != nil || n != 0 {
		t.Fatalf("Add = %d, %v; want 0 (the dedupe mark says duplicate)", n, err)
	}
	if n, err := q.pub.Readd(ctx, jobs(1, 0)...); err != nil || n != 1 {
		t.Fatalf("Readd = %d, %v; want 1", n, err)
	}
	if n := q.rdb.XLen(ctx, q.keys.Stream).Val(); n != 1 {
		t.Fatalf("stream length %d, want 1", n)
	}
	if ttl := markTTL(t, q.rdb, q.keys, "job-0"); ttl <= 0 {
		t.Fatalf("dedupe mark TTL %v, want set", ttl)
	}
	if _, err := q.pub.Readd(ctx, redisq.Job{}); err == nil {
		t.Fatal("Readd of an empty id succeeded")
	}
}

// A consumer whose entry was taken over after the lock duration and
// settled by the other one (dead-lettered) leaves its stale copy alone:
// the dead-letter stream holds the entry once.
func TestStaleCopyIsNotDeadLetteredTwice(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t, nil)
	cfg := &redisq.ConsumerConfig{LockDuration: 100 * time.Millisecond}
	slow := q.consumer(t, "slow", cfg)
	other := q.consumer(t, "other", cfg)
	q.rdb.XAdd(ctx, &redis.XAddArgs{Stream: q.keys.Stream, Values: []any{"garbage", "x"}})
	stale := fetchN(t, slow, 1)[0] // held while, say, Postgres is down
	var got []redisq.Delivery
	testenv.WaitFor(t, 10*time.Second, "entry taken over by the other consumer", func() bool {
		ds, err := other.Fetch(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ds...)
		return len(got) > 0
	})
	if err := other.DeadLetter(ctx, got[0], "malformed"); err != nil {
		t.Fatal(err)
	}
	if moved, err := slow.DeadLetterPending(ctx, stale, "malformed"); err != nil || moved {
		t.Fatalf("DeadLetterPending of the stale copy: moved %v, %v; want false, nil", moved, err)
	}
	if err := slow.DeadLetter(ctx, stale, "malformed"); err != nil {
		t.Fatalf("DeadLetter of the stale copy: %v", err)
	}
	if s := stats(t, slow); s.DeadLetters != 1 || s.Pending != 0 {
		t.Fatalf("stats %+v, want 1 dead letter and nothing pending", s)
	}
}
