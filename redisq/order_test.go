package redisq_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/redisq"
)

// An Add that fails has added a prefix of its jobs and nothing after the
// failure, so its retry keeps the order. The failure here is the batch
// refused by the server after earlier calls of the script succeeded: the
// publisher's ACL user may write the stream and the dedupe marks but not
// their expiry set (NOPERM). One atomic call per batch adds a prefix (here
// none: Redis checks a script's declared keys before running it), and once
// the ACL allows every key the retry adds all four in order.
func TestFailedAddAddsAPrefixAndItsRetryKeepsOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, admin := privateRedis(t)
	q := newQueue(t, admin)
	if _, err := q.pub.Add(ctx, redisq.Job{ID: "warm", Name: "n", Payload: []byte("{}")}); err != nil {
		t.Fatal(err) // loads the scripts into the server's cache
	}
	if _, err := q.pub.Readd(ctx, redisq.Job{ID: "warm", Name: "n", Payload: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	rule := func(keys ...string) []any {
		args := []any{"ACL", "SETUSER", "orderpub", "reset", "on", ">pw", "+@all"}
		for _, k := range keys {
			args = append(args, "~"+k)
		}
		return args
	}
	noTokens := rule(q.keys.Stream, q.keys.Dedupe)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "orderpub", Password: "pw"})
	t.Cleanup(func() { _ = rdb.Close() })
	pub, err := redisq.NewPublisher(rdb, &redisq.PublisherConfig{Queue: "chat", Prefix: q.prefix})
	if err != nil {
		t.Fatal(err)
	}
	// added returns the ids in the stream after the two "warm" entries.
	added := func() []string {
		es, err := admin.XRange(ctx, q.keys.Stream, "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range es[2:] {
			out = append(out, fmt.Sprint(e.Values["id"]))
		}
		return out
	}
	isPrefix := func(got []string) bool {
		for i, id := range got {
			if i >= 4 || id != fmt.Sprint("job-", i) {
				return false
			}
		}
		return true
	}
	for _, c := range []struct {
		name string
		add  func(context.Context, ...redisq.Job) (int, error)
	}{{"Add", pub.Add}, {"Readd", pub.Readd}} {
		if err := admin.Do(ctx, noTokens...).Err(); err != nil {
			t.Fatal(err)
		}
		if err := admin.Del(ctx, q.keys.Stream).Err(); err != nil {
			t.Fatal(err)
		}
		if err := admin.XAdd(ctx, &redis.XAddArgs{Stream: q.keys.Stream, Values: []any{"id", "warm"}}).Err(); err != nil {
			t.Fatal(err)
		}
		if err := admin.XAdd(ctx, &redis.XAddArgs{Stream: q.keys.Stream, Values: []any{"id", "warm"}}).Err(); err != nil {
			t.Fatal(err)
		}
		if err := admin.Del(ctx, q.keys.Dedupe, q.keys.DedupeTokens).Err(); err != nil {
			t.Fatal(err)
		}
		if n, err := c.add(ctx, jobs(4, 0)...); err == nil {
			t.Fatalf("%s with the re-add tokens forbidden = %d, nil; want an error", c.name, n)
		}
		if got := added(); !isPrefix(got) {
			t.Fatalf("after the failed %s the stream holds %v: not a prefix of [job-0 job-1 job-2 job-3]", c.name, got)
		}
		if err := admin.Do(ctx, rule(q.keys.Stream, q.keys.Dedupe, q.keys.DedupeTokens)...).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := c.add(ctx, jobs(4, 0)...); err != nil {
			t.Fatalf("retry %s: %v", c.name, err)
		}
		got := added()
		seen := map[string]bool{}
		var first []string // each id's first entry, in stream order
		for _, id := range got {
			if !seen[id] {
				seen[id] = true
				first = append(first, id)
			}
		}
		if fmt.Sprint(first) != "[job-0 job-1 job-2 job-3]" {
			t.Fatalf("after the retry of %s the stream holds %v: first entries %v, want [job-0 job-1 job-2 job-3]", c.name, got, first)
		}
	}
}

// A batch larger than one script call's bound is added in order, across
// the calls, with the duplicates counted.
func TestAddBeyondOneScriptCallKeepsOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t, nil)
	q.add(t, 10, 0)
	n, err := q.pub.Add(ctx, jobs(1200, 0)...)
	if err != nil || n != 1190 {
		t.Fatalf("Add of 1,200 jobs, 10 of them in the stream = %d, %v; want 1190, nil", n, err)
	}
	es, err := q.rdb.XRange(ctx, q.keys.Stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 1200 {
		t.Fatalf("stream holds %d entries, want 1200", len(es))
	}
	for i, e := range es {
		if want := fmt.Sprint("job-", i); e.Values["id"] != want {
			t.Fatalf("entry %d is %v, want %s", i, e.Values["id"], want)
		}
	}
}
