package redisq_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/outbox"
	"github.com/outboxchat/outboxchat/redisq"
)

type dlCounter struct {
	mu      sync.Mutex
	trimmed int64
}

func (m *dlCounter) onEvent(e redisq.Event) {
	if e.Kind == redisq.EventDeadLetterTrimmed {
		m.mu.Lock()
		m.trimmed += e.N
		m.mu.Unlock()
	}
}

// The dead-letter stream keeps at most DeadLetterMax entries (the oldest
// go, counted), and an entry keeps its signature; Replay puts an entry back
// on the stream with its sig, once (a repeat is a no-op), and the consumer
// gets it again; Drop deletes, idempotently.
func TestDeadLettersCapReplayDrop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t, nil)
	m := &dlCounter{}
	c := q.consumer(t, "w1", &redisq.ConsumerConfig{DeadLetterMax: 3, OnEvent: m.onEvent})
	var sigs []string
	for i := range 5 {
		j := jobs(1, i)[0]
		j.Sig = "v1=sig-" + j.ID
		sigs = append(sigs, j.Sig)
		if _, err := q.pub.Add(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range fetchN(t, c, 5) {
		if err := c.DeadLetter(ctx, d, "poison"); err != nil {
			t.Fatal(err)
		}
	}
	dls, err := redisq.NewDeadLetters(q.rdb, q.prefix, "chat", 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	list, err := dls.List(ctx, "", 0)
	if err != nil || len(list) != 3 {
		t.Fatalf("List = %d entries, %v; want the 3 newest", len(list), err)
	}
	m.mu.Lock()
	trimmed := m.trimmed
	m.mu.Unlock()
	if trimmed != 2 {
		t.Errorf("trimmed %d; want 2", trimmed)
	}
	first := list[0]
	if first.ID != "job-2" || first.Sig != sigs[2] || first.Reason != "poison" || first.StreamID == "" || first.At.IsZero() {
		t.Fatalf("oldest kept %+v; want job-2 with its sig", first)
	}
	if page, err := dls.List(ctx, first.DeadID, 1); err != nil || len(page) != 1 || page[0].ID != "job-3" {
		t.Fatalf("List after %s = %+v, %v", first.DeadID, page, err)
	}
	got, ok, err := dls.Get(ctx, first.DeadID)
	if err != nil || !ok || got.ID != "job-2" {
		t.Fatalf("Get = %+v, %v, %v", got, ok, err)
	}

	ids, err := dls.Replay(ctx, first.DeadID, first.DeadID)
	if err != nil || len(ids) != 2 || ids[0] == "" || ids[1] != "" {
		t.Fatalf("Replay twice = %q, %v; want a new stream id, then nothing", ids, err)
	}
	ds := fetchN(t, c, 1)
	if ds[0].ID != "job-2" || ds[0].Sig != sigs[2] || ds[0].StreamID != ids[0] {
		t.Fatalf("replayed delivery %+v; want job-2 with its sig", ds[0])
	}
	if err := c.Ack(ctx, ds[0].StreamID); err != nil {
		t.Fatal(err)
	}
	if n, err := dls.Drop(ctx, list[1].DeadID, list[1].DeadID); err != nil || n != 1 {
		t.Fatalf("Drop = %d, %v; want 1", n, err)
	}
	if n, err := dls.Drop(ctx, list[1].DeadID); err != nil || n != 0 {
		t.Fatalf("second Drop = %d, %v; want 0", n, err)
	}
	if n, err := dls.Len(ctx); err != nil || n != 1 {
		t.Fatalf("Len = %d, %v; want 1", n, err)
	}
}

// Inspect reports the stream's length, each group's pending and lag and
// each consumer's idle time, and the dead letters.
func TestInspect(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t, nil)
	qi, err := redisq.Inspect(ctx, q.rdb, q.prefix, "chat")
	if err != nil || qi.Length != 0 || len(qi.Groups) != 0 {
		t.Fatalf("Inspect of no stream = %+v, %v", qi, err)
	}
	c := q.consumer(t, "w1", nil)
	q.add(t, 5, 0)
	ds := fetchN(t, c, 2)
	if err := c.DeadLetter(ctx, ds[0], "bad"); err != nil {
		t.Fatal(err)
	}
	qi, err = redisq.Inspect(ctx, q.rdb, q.prefix, "chat")
	if err != nil || len(qi.Groups) != 1 {
		t.Fatalf("Inspect = %+v, %v", qi, err)
	}
	g := qi.Groups[0]
	if qi.Length != 5 || qi.DeadLetters != 1 || g.Name != "workers" || g.Pending != 1 || g.Lag != 3 ||
		len(g.Consumers) != 1 || g.Consumers[0].Name != "w1" || g.Consumers[0].Pending != 1 || g.Consumers[0].Idle > time.Minute {
		t.Fatalf("Inspect = %+v", qi)
	}
}

// OutboxPublisher turns a job's own fault (an empty id) into an
// outbox.MessageError naming its row, after adding the jobs before it;
// Redis being down is not a job's fault.
func TestOutboxPublisherBlamesTheJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := newQueue(t, nil)
	p := redisq.OutboxPublisher(q.pub)
	msgs := []outbox.Message{{RowID: 1, ID: "a", Event: "e", Payload: []byte("{}")},
		{RowID: 2, ID: "", Event: "e", Payload: []byte("{}")}, {RowID: 3, ID: "c", Event: "e", Payload: []byte("{}")}}
	err := p.Publish(ctx, msgs)
	var me *outbox.MessageError
	if !errors.As(err, &me) || me.RowID != 2 || !errors.Is(err, redisq.ErrInvalidJob) {
		t.Fatalf("Publish = %v; want a MessageError for row 2", err)
	}
	var got []string
	for _, e := range q.rdb.XRange(ctx, q.keys.Stream, "-", "+").Val() {
		got = append(got, e.Values["id"].(string))
	}
	if !slices.Equal(got, []string{"a"}) {
		t.Fatalf("stream holds %v; want [a] (the job before the bad one)", got)
	}
	if _, own := redisq.JobFault(context.DeadlineExceeded); own {
		t.Error("a timeout counted as a job's fault")
	}
}
