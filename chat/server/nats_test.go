package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/auth"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/natsq"
	"github.com/outboxchat/outboxchat/redisq"
)

// onNATS puts the queue of a service started with it on url's JetStream,
// its events signed with keysFile's keys.
func onNATS(url, keysFile string, more ...func(*Config)) func(*Config) {
	return func(c *Config) {
		c.BrokerURL, c.EventKeyFile = url, keysFile
		for _, f := range more {
			f(c)
		}
	}
}

// The chat with its queue on NATS JetStream: each side's messages reach
// the other's sockets once each, in seq order, signed and checked, and the
// receipts come back through it. The NATS server stopped: sends still
// answer 201 and wait in the outbox, /readyz names the broker; when it is
// back, every message is delivered, none twice, in order.
func TestChatOnNATS(t *testing.T) {
	t.Parallel()
	ns := testenv.PrivateNATS(t)
	keys := writeEventKeys(t, "consumers-to-workers "+hexKey(1), "workers-to-consumers "+hexKey(2))
	h := newHarness(t, "")
	cons, work := h.start(chat.Consumers, onNATS(ns.URL(), keys)), h.start(chat.Workers, onNATS(ns.URL(), keys))
	wWork := chattest.Watch(t, work.base, 7)
	wCons := chattest.Watch(t, cons.base, 7)
	for i := 1; i <= 5; i++ {
		chattest.Send(t, cons.base, 7, fmt.Sprintf("from consumers %d", i))
		chattest.Send(t, work.base, 7, fmt.Sprintf("from workers %d", i))
	}
	wWork.WaitSeqs(t, chat.Consumers, 5, 10*time.Second)
	wCons.WaitSeqs(t, chat.Workers, 5, 10*time.Second)
	testenv.WaitFor(t, 15*time.Second, "a receipt up to seq 5 on the sender's socket", func() bool {
		return wCons.LastReceipt(chat.Consumers).UptoSeq == 5
	})
	// The events went through JetStream, not Redis: the streams hold them.
	js, err := jetstream.New(natsConn(t, ns.URL()))
	if err != nil {
		t.Fatal(err)
	}
	info, err := js.Stream(context.Background(), chat.NATSName(h.Prefix)+"consumers-to-workers")
	if err != nil {
		t.Fatal(err)
	}
	if n := info.CachedInfo().State.Msgs; n < 5 {
		t.Fatalf("the consumers-to-workers stream holds %d events, want the 5 messages at least", n)
	}

	if err := ns.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "/readyz to name the broker", func() bool {
		code, body := getStatus(t, cons.base+"/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "broker unavailable") && strings.Contains(body, "relay,worker")
	})
	for i := 6; i <= 10; i++ {
		chattest.Send(t, cons.base, 7, fmt.Sprint("during outage ", i))
	}
	if n := h.Count(t, `SELECT count(*) FROM consumers.outbox`); n < 5 {
		t.Fatalf("%d outbox rows while NATS is down, want the 5 sends waiting", n)
	}
	if err := ns.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := wWork.WaitSeqs(t, chat.Consumers, 10, 30*time.Second)
	for i, m := range got {
		if m.Seq != int64(i+1) {
			t.Fatalf("frame %d has seq %d: out of order or twice", i, m.Seq)
		}
	}
	testenv.WaitFor(t, 10*time.Second, "outbox drained and /readyz ready", func() bool {
		code, _ := getStatus(t, cons.base+"/readyz")
		return code == http.StatusOK && h.Count(t, `SELECT count(*) FROM consumers.outbox`) == 0
	})
	if n := h.Count(t, `SELECT count(*) FROM workers.inbox WHERE chat_id = 7`); n != 10 {
		t.Fatalf("workers.inbox has %d rows, want 10", n)
	}
}

// The stream on NATS is purged after the relay published (its events lost
// before the worker read them): the re-drive publishes them again inside
// the duplicate window, and the receiver shows each once.
func TestRedriveHealsAPurgedNATSStream(t *testing.T) {
	t.Parallel()
	ns := testenv.PrivateNATS(t)
	h := newHarness(t, "")
	fast := func(c *Config) { c.LockDuration = time.Second } // re-drive after 2 s
	cons := h.start(chat.Consumers, onNATS(ns.URL(), "", fast))
	work := h.start(chat.Workers, onNATS(ns.URL(), "", fast))
	publishUnread(t, h, cons, work, `SELECT count(*) FROM consumers.outbox`)
	js, err := jetstream.New(natsConn(t, ns.URL()))
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(context.Background(), chat.NATSName(h.Prefix)+"consumers-to-workers")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Purge(context.Background()); err != nil {
		t.Fatal(err)
	}
	work = h.start(chat.Workers, onNATS(ns.URL(), "", fast))
	redriveHealed(t, h, cons, work, 4, 20*time.Second)
}

// A broker URL that is not a NATS one is refused before anything starts,
// without its password in the error.
func TestBrokerURLErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Service: chat.Consumers, BrokerURL: "redis://u:secret@localhost:6379"}, "want nats://"},
	} {
		err := c.cfg.WithDefaults().validate()
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "secret") {
			t.Errorf("validate(%q, mode %q) = %v, want an error with %q and no password", c.cfg.BrokerURL, c.cfg.Mode, err, c.want)
		}
	}
}

// natsConn is a connection of the test's own to url, closed at cleanup.
func natsConn(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := natsq.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Someone who can publish into the NATS stream forges events for chat 7
// seq 1 before the real message 1 is sent, one unsigned and one signed
// with a key the services do not have: both are dead-lettered in the
// stream's dead letters with their reason (and the workers' /metrics
// counts them there, not in Redis), and the real message takes its slot
// and reaches the room.
func TestForgedNATSEventDoesNotTakeSlot(t *testing.T) {
	t.Parallel()
	ns := testenv.PrivateNATS(t)
	keysFile := writeEventKeys(t, "consumers-to-workers "+hexKey(1), "workers-to-consumers "+hexKey(2))
	h := newHarness(t, "")
	work := h.start(chat.Workers, onNATS(ns.URL(), keysFile))
	w := chattest.Watch(t, work.base, 7)
	attacker, err := auth.ReadEventKeys(writeEventKeys(t, "consumers-to-workers "+hexKey(9), "workers-to-consumers "+hexKey(9)))
	if err != nil {
		t.Fatal(err)
	}
	// The worker made sure of the stream at its start.
	q, err := natsq.New(context.Background(), natsConn(t, ns.URL()), natsq.Config{Queue: "consumers-to-workers",
		Prefix: chat.NATSName(h.Prefix), MaxAge: NATSMaxAge})
	if err != nil {
		t.Fatal(err)
	}
	for _, signer := range []*auth.EventKeys{nil, attacker} {
		id := uuid.NewString()
		payload, _ := json.Marshal(chat.Message{ID: id, ChatID: 7, Seq: 1, Body: "forged", SentAt: time.Now(), From: chat.Consumers})
		ev := natsq.Event{ID: id, Name: chat.EventMessageCreated, Payload: payload}
		if signer != nil {
			ev.Sig = signer.Signer(chat.QueueName(chat.Consumers))(redisq.Job{ID: ev.ID, Name: ev.Name, Payload: ev.Payload})
		}
		if err := q.Publish(context.Background(), ev); err != nil {
			t.Fatal(err)
		}
	}
	var dls []natsq.DeadLetter
	testenv.WaitFor(t, 20*time.Second, "both forged events dead-lettered", func() bool {
		dls, _ = q.DeadLetters(context.Background(), 0, 10)
		return len(dls) == 2
	})
	reasons := dls[0].Reason + " | " + dls[1].Reason
	if !strings.Contains(reasons, auth.ErrUnsigned.Error()) || !strings.Contains(reasons, auth.ErrForged.Error()) {
		t.Fatalf("dead-letter reasons %q: want one unsigned, one forged", reasons)
	}
	// The queue's gauges read JetStream: Redis's dead-letter stream, which
	// a queue on NATS leaves empty, would say 0.
	testenv.WaitFor(t, 20*time.Second, "outboxchat_deadletter_entries 2 on the workers' /metrics", func() bool {
		return scrape(t, work.base, "outboxchat_deadletter_entries") == 2
	})
	if n := h.Count(t, `SELECT count(*) FROM workers.inbox`); n != 0 {
		t.Fatalf("a forged event reached the inbox (%d rows)", n)
	}
	cons := h.start(chat.Consumers, onNATS(ns.URL(), keysFile))
	chattest.Send(t, cons.base, 7, "real")
	got := w.WaitSeqs(t, chat.Consumers, 1, 10*time.Second)
	if got[0].Body != "real" {
		t.Fatalf("seq 1 shown as %q, want the real message", got[0].Body)
	}
}
