package server

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/chat/status"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/outbox"
)

// The order policy for a parked message: one message's publish fails (a
// fault hook blames it with an outbox.MessageError); while it backs off it
// holds back the rows behind it; once parked, the messages behind it flow,
// the receiver's gateway holds them for its gap timeout and then shows them
// past the gap; `outbox retry` (outbox.Retry) later delivers the parked
// one, shown late, and the history has every message in seq order.
func TestParkedMessageLeavesAGapThenRetryDelivers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := newHarness(t, "")
	const chatID, badSeq = 7, 2
	var failing atomic.Bool
	failing.Store(true)
	poison := func(p outbox.Publisher) outbox.Publisher {
		return outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) error {
			for i, m := range msgs {
				if failing.Load() && m.Event == chat.EventMessageCreated && seqOf(m.Payload) == badSeq {
					if err := p.Publish(ctx, msgs[:i]); err != nil {
						return err
					}
					return &outbox.MessageError{RowID: m.RowID, Err: errors.New("fault hook: this message cannot be published")}
				}
			}
			return p.Publish(ctx, msgs)
		})
	}
	cons := h.start(chat.Consumers, func(c *Config) { c.Hooks = testHooks{publisher: poison}; c.Relay.MaxAttempts = 3 })
	const gap = 2 * time.Second
	work := h.start(chat.Workers, func(c *Config) { c.API.GapTimeout = gap })
	w := chattest.Watch(t, work.base, chatID)
	for _, b := range []string{"m1", "m2", "m3", "m4"} {
		chattest.Send(t, cons.base, chatID, b)
	}
	// m3 and m4 wait for m2 to be parked, then reach the inbox; the
	// gateway holds them behind the gap for about GapTimeout.
	testenv.WaitFor(t, 30*time.Second, "m3 in the workers' inbox", func() bool {
		return h.Count(t, `SELECT count(*) FROM workers.inbox WHERE chat_id = $1 AND seq = 3`, chatID) == 1
	})
	var stored time.Time
	if err := h.Admin.QueryRow(ctx, `SELECT received_at FROM workers.inbox WHERE chat_id = $1 AND seq = 3`, chatID).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	var shown time.Time
	testenv.WaitFor(t, 30*time.Second, "m3 on the socket", func() bool {
		// WaitFor polls every 5 ms: the arrival time is read to ~5 ms.
		if len(w.From(chat.Consumers)) >= 2 {
			shown = time.Now()
			return true
		}
		return false
	})
	if held := shown.Sub(stored); held < gap-300*time.Millisecond {
		t.Errorf("m3 shown %v after its inbox commit; want the gateway to hold it about %v behind the gap", held, gap)
	}
	testenv.WaitFor(t, 10*time.Second, "m4 on the socket", func() bool { return len(w.From(chat.Consumers)) >= 3 })
	if got := seqs(w.From(chat.Consumers)); !slices.Equal(got, []int64{1, 3, 4}) {
		t.Fatalf("socket showed seqs %v; want [1 3 4] (m2 parked)", got)
	}
	if n := h.Count(t, `SELECT count(*) FROM consumers.outbox WHERE parked_at IS NOT NULL AND failures = 3`); n != 1 {
		t.Fatalf("%d parked rows with 3 failures; want 1", n)
	}
	metrics, err := chattest.Get(cons.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"outboxchat_relay_parked_total 1", "outboxchat_outbox_parked 1", "outboxchat_outbox_unsent "} {
		if !strings.Contains(metrics, want) {
			t.Errorf("consumers /metrics lacks %q", want)
		}
	}

	failing.Store(false) // the fix
	re, err := outbox.Retry(ctx, h.Admin, "consumers.outbox", chat.OutboxChannel(chat.Consumers), nil)
	if err != nil || len(re) != 1 {
		t.Fatalf("Retry = %+v, %v; want the parked m2", re, err)
	}
	testenv.WaitFor(t, 20*time.Second, "m2 on the socket", func() bool { return len(w.From(chat.Consumers)) >= 4 })
	if got := seqs(w.From(chat.Consumers)); !slices.Equal(got, []int64{1, 3, 4, 2}) {
		t.Fatalf("socket showed seqs %v; want [1 3 4 2] (m2 late, once)", got)
	}
	if n := h.Count(t, `SELECT count(*) FROM workers.inbox WHERE chat_id = $1`, chatID); n != 4 {
		t.Fatalf("workers' inbox holds %d of chat %d; want 4", n, chatID)
	}
	// The relay deletes m2's row in the commit after its publish, which
	// may come after the worker showed it.
	testenv.WaitFor(t, 10*time.Second, "consumers' outbox empty", func() bool {
		return h.Count(t, `SELECT count(*) FROM consumers.outbox`) == 0
	})
	// The relay's heartbeat (at most every 5 s) tells status its last pass.
	testenv.WaitFor(t, 20*time.Second, "a fresh relay heartbeat", func() bool {
		return h.Count(t, `SELECT count(*) FROM consumers.relay_heartbeat WHERE pass_at > now() - interval '10 seconds'`) == 1
	})
	st, err := status.ReadStatus(ctx, h.Admin, testenv.Redis(t), nil, h.Prefix, status.StatusThresholds{}, status.CommandFlags{})
	if err != nil || !st.Healthy || st.Services[0].LastRelayPassSeconds == nil || *st.Services[0].LastRelayPassSeconds > 10 ||
		st.Services[1].Stream == "" || len(st.Services[1].Consumers) != 1 {
		t.Fatalf("status with both services running = %+v, %v", st, err)
	}
	// The heartbeat says the relay listens, and the worker is live under
	// its consumer name.
	if r := st.Services[0].Relays; len(r) != 1 || r[0].Listening == nil || !*r[0].Listening ||
		st.Services[1].Consumers[0].Processes != 1 || len(st.Services[1].LiveConsumers) != 1 {
		t.Fatalf("status relays %+v, consumers %+v, live %+v", r, st.Services[1].Consumers, st.Services[1].LiveConsumers)
	}
}

func seqs(ms []chat.Message) []int64 {
	out := make([]int64, len(ms))
	for i, m := range ms {
		out[i] = m.Seq
	}
	return out
}

// seqOf reads the seq of a message.created payload (0 if none).
func seqOf(payload []byte) int64 {
	var p struct {
		Seq int64 `json:"seq"`
	}
	_ = json.Unmarshal(payload, &p)
	return p.Seq
}
