package redisq_test

import (
	"context"
	"errors"
	"maps"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/outbox"
	"github.com/outboxchat/outboxchat/redisq"
)

// TestHeadersTravel: a job's headers come back in its delivery after an
// Add, a Readd, a dead letter and its replay; a job without headers has
// none; an entry written before headers existed (no field) reads as
// before.
func TestHeadersTravel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t, nil)
	c := q.consumer(t, "w1", nil)
	h := map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tenant": "acme"}
	js := jobs(2, 0)
	js[0].Headers, js[0].Sig = h, "v1=sig"
	if _, err := q.pub.Add(ctx, js...); err != nil {
		t.Fatal(err)
	}
	// An old-format entry, as an earlier Add wrote it: no headers field.
	if err := q.rdb.XAdd(ctx, &redis.XAddArgs{Stream: q.keys.Stream,
		Values: []any{"id", "old", "name", "message.created", "payload", "{}"}}).Err(); err != nil {
		t.Fatal(err)
	}
	ds := fetchN(t, c, 3)
	check := func(what string, d redisq.Delivery, want map[string]string) {
		t.Helper()
		if d.Err != nil || !maps.Equal(d.Headers, want) || (want == nil) != (d.Headers == nil) {
			t.Fatalf("%s: delivery %s headers %v err %v; want %v", what, d.ID, d.Headers, d.Err, want)
		}
	}
	check("add", ds[0], h)
	check("add without headers", ds[1], nil)
	check("old entry", ds[2], nil)
	if ds[0].Sig != "v1=sig" {
		t.Fatalf("sig %q lost beside the headers", ds[0].Sig)
	}
	if err := c.DeadLetter(ctx, ds[0], "poison"); err != nil {
		t.Fatal(err)
	}
	if err := c.Ack(ctx, ds[1].StreamID, ds[2].StreamID); err != nil {
		t.Fatal(err)
	}
	dls, err := redisq.NewDeadLetters(q.rdb, q.prefix, "chat", 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	list, err := dls.List(ctx, "", 0)
	if err != nil || len(list) != 1 || !maps.Equal(list[0].Headers, h) {
		t.Fatalf("dead letters %+v, %v; want job-0 with its headers", list, err)
	}
	if _, err := dls.Replay(ctx, list[0].DeadID); err != nil {
		t.Fatal(err)
	}
	d := fetchN(t, c, 1)[0]
	check("replay", d, h)
	if err := c.Ack(ctx, d.StreamID); err != nil {
		t.Fatal(err)
	}
	if _, err := q.pub.Readd(ctx, js[0]); err != nil {
		t.Fatal(err)
	}
	check("readd", fetchN(t, c, 1)[0], h)
}

// TestHeadersOverLimitRefused: Add refuses a job whose headers break a
// limit (ErrInvalidJob and outbox.ErrInvalidHeaders, a fault of the job)
// and sends nothing; an entry whose headers field is not a JSON object of
// strings is delivered with ErrMalformedEntry, to be dead-lettered.
func TestHeadersOverLimitRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t, nil)
	js := jobs(2, 0)
	js[1].Headers = map[string]string{"k": strings.Repeat("v", outbox.MaxHeaderValueBytes+1)}
	_, err := q.pub.Add(ctx, js...)
	if !errors.Is(err, redisq.ErrInvalidJob) || !errors.Is(err, outbox.ErrInvalidHeaders) {
		t.Fatalf("Add = %v; want ErrInvalidJob and ErrInvalidHeaders", err)
	}
	if je, own := redisq.JobFault(err); !own || je.Index != 1 {
		t.Fatalf("JobFault = %+v, %v; want job 1's fault", je, own)
	}
	if n := q.rdb.XLen(ctx, q.keys.Stream).Val(); n != 0 {
		t.Fatalf("stream holds %d entries; want none", n)
	}
	for _, bad := range []string{`{"k":1}`, `[]`, `null`, `{`} {
		if err := q.rdb.XAdd(ctx, &redis.XAddArgs{Stream: q.keys.Stream,
			Values: []any{"id", "x", "name", "n", "payload", "{}", "headers", bad}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range fetchN(t, q.consumer(t, "w1", nil), 4) {
		if !errors.Is(d.Err, redisq.ErrMalformedEntry) {
			t.Errorf("entry %s: Err %v; want ErrMalformedEntry", d.StreamID, d.Err)
		}
	}
}
