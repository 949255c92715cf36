package fault

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/outbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseCrash(t *testing.T) {
	for _, tc := range []struct {
		spec, kind string
		seq        int64
		err        string
	}{
		{spec: ""},
		{spec: "worker-crash-after-commit:3", kind: WorkerAfterCommit, seq: 3},
		{spec: "worker-crash-before-commit:12", kind: WorkerBeforeCommit, seq: 12},
		{spec: "relay-crash-after-publish:1", kind: RelayAfterPublish, seq: 1},
		{spec: "relay-crash-after-publish", err: "want KIND:SEQ"},
		{spec: "relay-crash-after-publish:0", err: "positive seq"},
		{spec: "relay-crash-after-publish:x", err: "positive seq"},
		{spec: "disk-full:3", err: "unknown kind"},
	} {
		f, err := ParseCrash(tc.spec, nil)
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), tc.spec) {
				t.Errorf("ParseCrash(%q) = %v, want an error naming the spec and %q", tc.spec, err, tc.err)
			}
		case err != nil:
			t.Errorf("ParseCrash(%q): %v", tc.spec, err)
		case tc.spec == "":
			if f != nil {
				t.Errorf("ParseCrash(\"\") = %v, want nil", f)
			}
		case f.Kind() != tc.kind || f.Seq() != tc.seq:
			t.Errorf("ParseCrash(%q) = %s:%d", tc.spec, f.Kind(), f.Seq())
		}
	}
}

// armed parses spec with a kill that counts instead of killing, and a log
// into buf.
func armed(t *testing.T, spec string, buf *bytes.Buffer) (*Crash, *int) {
	t.Helper()
	f, err := ParseCrash(spec, slog.New(slog.NewJSONHandler(buf, nil)))
	if err != nil {
		t.Fatal(err)
	}
	kills := new(int)
	f.kill = func() { *kills++ }
	return f, kills
}

func payload(seq int64) []byte {
	b, _ := json.Marshal(map[string]any{"seq": seq, "chat_id": 1})
	return b
}

// checkCrashLine: the line the lab reads before the kill.
func checkCrashLine(t *testing.T, buf *bytes.Buffer, kind string, seq int64) {
	t.Helper()
	var l map[string]any
	if err := json.Unmarshal(buf.Bytes(), &l); err != nil {
		t.Fatalf("crash line %q: %v", buf.String(), err)
	}
	if l["msg"] != chat.EventLogMsg || l[chat.EventKey] != EventCrash || l["fault"] != kind || l["seq"] != float64(seq) {
		t.Fatalf("crash line %v", l)
	}
}

func TestRelayAfterPublish(t *testing.T) {
	var buf bytes.Buffer
	f, kills := armed(t, "relay-crash-after-publish:2", &buf)
	var published int
	inner := outbox.PublisherFunc(func(_ context.Context, msgs []outbox.Message) error { published += len(msgs); return nil })
	p := f.Publisher(inner)
	ctx := context.Background()
	if err := p.Publish(ctx, []outbox.Message{{Payload: payload(1)}}); err != nil || *kills != 0 {
		t.Fatalf("seq 1: err %v, kills %d", err, *kills)
	}
	if err := p.Publish(ctx, []outbox.Message{{Payload: payload(2)}, {Payload: payload(3)}}); err != nil || *kills != 1 {
		t.Fatalf("seq 2: err %v, kills %d", err, *kills)
	}
	if published != 3 {
		t.Fatalf("published %d, want 3: the crash comes after the publish", published)
	}
	checkCrashLine(t, &buf, RelayAfterPublish, 2)
	// The other parts are left alone.
	var h inbox.Handler = inbox.HandlerFunc(func(context.Context, pgx.Tx, inbox.Delivery) (bool, error) { return true, nil })
	if _, err := f.Handler(h).Apply(ctx, nil, inbox.Delivery{Payload: payload(2)}); err != nil || *kills != 1 {
		t.Fatalf("handler of a relay fault crashed")
	}
}

func TestWorkerBeforeCommit(t *testing.T) {
	var buf bytes.Buffer
	f, kills := armed(t, "worker-crash-before-commit:5", &buf)
	var applied []int64
	h := f.Handler(inbox.HandlerFunc(func(_ context.Context, _ pgx.Tx, d inbox.Delivery) (bool, error) {
		applied = append(applied, payloadSeq(d.Payload))
		return true, nil
	}))
	ctx := context.Background()
	for _, seq := range []int64{4, 5} {
		if _, err := h.Apply(ctx, nil, inbox.Delivery{Payload: payload(seq)}); err != nil {
			t.Fatal(err)
		}
	}
	if *kills != 1 {
		t.Fatalf("kills %d, want 1", *kills)
	}
	checkCrashLine(t, &buf, WorkerBeforeCommit, 5)
	p := f.Publisher(outbox.PublisherFunc(func(context.Context, []outbox.Message) error { return nil }))
	if err := p.Publish(ctx, []outbox.Message{{Payload: payload(5)}}); err != nil || *kills != 1 {
		t.Fatalf("publisher of a worker fault crashed")
	}
}

// source hands out fixed deliveries and records acks.
type source struct {
	ds    []inbox.Delivery
	acked []string
}

func (s *source) Fetch(context.Context, int) ([]inbox.Delivery, error) { return s.ds, nil }
func (s *source) Ack(_ context.Context, refs ...string) error {
	s.acked = append(s.acked, refs...)
	return nil
}
func (s *source) DeadLetter(context.Context, inbox.Delivery, string) error { return nil }

func TestWorkerAfterCommit(t *testing.T) {
	var buf bytes.Buffer
	f, kills := armed(t, "worker-crash-after-commit:7", &buf)
	inner := &source{ds: []inbox.Delivery{{Ref: "1-0", Payload: payload(6)}, {Ref: "2-0", Payload: payload(7)}}}
	src := f.Source(inner)
	ctx := context.Background()
	if _, err := src.Fetch(ctx, 10); err != nil {
		t.Fatal(err)
	}
	if err := src.Ack(ctx, "1-0"); err != nil || *kills != 0 {
		t.Fatalf("ack of seq 6: err %v, kills %d", err, *kills)
	}
	if err := src.Ack(ctx, "2-0"); err != nil || *kills != 1 {
		t.Fatalf("ack of seq 7: err %v, kills %d", err, *kills)
	}
	checkCrashLine(t, &buf, WorkerAfterCommit, 7)
	if f2, _ := armed(t, "relay-crash-after-publish:7", &buf); f2.Source(inner) != inbox.Source(inner) {
		t.Fatalf("a relay fault wrapped the source")
	}
}
