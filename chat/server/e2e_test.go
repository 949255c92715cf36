package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/outbox"
	"github.com/outboxchat/outboxchat/redisq"
)

// Both directions: a message sent on each side reaches a WebSocket client of
// the other side with its seq, exactly once; the sender's own client sees it
// too, and history agrees.
func TestBothDirectionsExactlyOnce(t *testing.T) {
	t.Parallel()
	h, cons, work := startBoth(t)
	wWork := chattest.Watch(t, work.base, 7)
	wCons := chattest.Watch(t, cons.base, 7)
	for i := 1; i <= 5; i++ {
		m := chattest.Send(t, cons.base, 7, fmt.Sprintf("from consumers %d", i))
		if m.Seq != int64(i) || m.From != chat.Consumers || m.ChatID != 7 {
			t.Fatalf("send answered %+v, want seq %d from consumers in chat 7", m, i)
		}
		chattest.Send(t, work.base, 7, fmt.Sprintf("from workers %d", i))
	}
	got := wWork.WaitSeqs(t, chat.Consumers, 5, 10*time.Second)
	if got[2].Body != "from consumers 3" || got[2].ReceivedAt == nil {
		t.Fatalf("frame 3 = %+v, want body 'from consumers 3' with received_at", got[2])
	}
	wCons.WaitSeqs(t, chat.Workers, 5, 10*time.Second)
	// Each side's own messages are shown to its own clients too.
	wWork.WaitSeqs(t, chat.Workers, 5, 10*time.Second)
	wCons.WaitSeqs(t, chat.Consumers, 5, 10*time.Second)
	if n := h.Count(t, `SELECT count(*) FROM workers.inbox WHERE chat_id = 7`); n != 5 {
		t.Fatalf("workers.inbox has %d rows, want 5", n)
	}
	// Receipts are outbox rows too, published at most 50 ms after their
	// inbox commit: wait for the outbox to drain.
	testenv.WaitFor(t, 10*time.Second, "no unsent outbox rows", func() bool {
		return h.Count(t, `SELECT count(*) FROM consumers.outbox WHERE sent_at IS NULL`) == 0
	})
	// The counts show on /metrics.
	cm, err := chattest.Get(cons.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	wm, err := chattest.Get(work.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	// Published and applied count the receipts too (at least one per side
	// came back), so at least 5 each.
	for _, want := range []string{`outboxchat_relay_published_total ([5-9]|\d\d+)\n`, `outboxchat_relay_listening 1\n`, `outboxchat_inbox_applied_total ([5-9]|\d\d+)\n`} {
		re := regexp.MustCompile(want)
		if !re.MatchString(cm) || !re.MatchString(wm) {
			t.Errorf("/metrics of both services should match %q", want)
		}
	}
}

// A client that reconnects with its cursors gets what it missed, then live
// messages, without duplicates.
func TestReconnectCatchesUpBySeq(t *testing.T) {
	t.Parallel()
	h, cons, work := startBoth(t)
	for i := 1; i <= 3; i++ {
		chattest.Send(t, cons.base, 9, fmt.Sprint("m", i))
	}
	testenv.WaitFor(t, 10*time.Second, "3 inbox rows", func() bool {
		return h.Count(t, `SELECT count(*) FROM workers.inbox`) == 3
	})
	// Seen up to consumers seq 2: the socket must start at 3.
	ctx := context.Background()
	w := chattest.WatchURL(t, ctx, work.base+"/ws?chat_id=9&after_consumers=2")
	chattest.Send(t, cons.base, 9, "m4")
	testenv.WaitFor(t, 10*time.Second, "seqs 3 and 4", func() bool { return len(w.From(chat.Consumers)) >= 2 })
	got := w.From(chat.Consumers)
	if len(got) != 2 || got[0].Seq != 3 || got[1].Seq != 4 {
		t.Fatalf("after_consumers=2 gave %+v, want seqs 3, 4", got)
	}
	// History agrees, with after_seq.
	hist, err := chattest.Get(work.base + "/api/chats/9/messages?after_seq=1")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(hist, `"seq":2`) || strings.Contains(hist, `"seq":1,`) {
		t.Fatalf("history after_seq=1: %s", hist)
	}
}

// Redis stopped: sends still answer 201 (they touch only Postgres); when
// Redis returns, every message is delivered, in seq order, none twice.
func TestRedisDownSendsSucceedAndDeliverLater(t *testing.T) {
	t.Parallel()
	rs := testenv.PrivateRedis(t)
	h := newHarness(t, rs.URL())
	cons, work := h.start(chat.Consumers, nil), h.start(chat.Workers, nil)
	w := chattest.Watch(t, work.base, 3)
	chattest.Send(t, cons.base, 3, "before")
	w.WaitSeqs(t, chat.Consumers, 1, 10*time.Second)
	if err := rs.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Not ready while the relay and worker roles cannot reach Redis, and
	// the body says why.
	code, body := getStatus(t, cons.base+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "redis unavailable") || !strings.Contains(body, "relay,worker") {
		t.Fatalf("/readyz with Redis down: %d %s; want 503 naming redis and the roles", code, body)
	}
	for i := 2; i <= 6; i++ {
		chattest.Send(t, cons.base, 3, fmt.Sprint("during outage ", i))
	}
	if n := h.Count(t, `SELECT count(*) FROM consumers.outbox WHERE sent_at IS NULL`); n != 5 {
		t.Fatalf("%d unsent outbox rows while Redis is down, want 5", n)
	}
	if err := rs.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	w.WaitSeqs(t, chat.Consumers, 6, 20*time.Second)
	if code, body := getStatus(t, cons.base+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz with Redis back: %d %s", code, body)
	}
	testenv.WaitFor(t, 5*time.Second, "outbox drained", func() bool {
		return h.Count(t, `SELECT count(*) FROM consumers.outbox WHERE sent_at IS NULL`) == 0
	})
}

// The relay dies after its publish and before its commit (the publish
// succeeded, the mark-sent transaction did not commit): the next pass
// publishes again, and the inbox shows each message once.
func TestRelayCrashBetweenPublishAndCommit(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	var failed atomic.Int32
	crashy := func(p outbox.Publisher) outbox.Publisher {
		return outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) error {
			if err := p.Publish(ctx, msgs); err != nil {
				return err
			}
			if failed.Add(1) <= 2 {
				return errors.New("simulated crash after publish")
			}
			return nil
		})
	}
	cons := h.start(chat.Consumers, func(c *Config) { c.Hooks = testHooks{publisher: crashy} })
	work := h.start(chat.Workers, nil)
	w := chattest.Watch(t, work.base, 4)
	for i := 1; i <= 4; i++ {
		chattest.Send(t, cons.base, 4, fmt.Sprint("m", i))
	}
	w.WaitSeqs(t, chat.Consumers, 4, 15*time.Second)
	testenv.WaitFor(t, 5*time.Second, "outbox drained", func() bool {
		return h.Count(t, `SELECT count(*) FROM consumers.outbox WHERE sent_at IS NULL`) == 0
	})
	if failed.Load() < 3 {
		t.Fatalf("publisher called %d times, want the crashes and a retry", failed.Load())
	}
	if n := h.Count(t, `SELECT count(*) FROM workers.inbox`); n != 4 {
		t.Fatalf("inbox has %d rows, want 4", n)
	}
	// The published rows are deleted; the failed passes are counted.
	metrics, err := chattest.Get(cons.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(metrics, `outboxchat_relay_failures_total{stage="publish"} 2`) {
		t.Fatalf("the two failed passes are not in the relay's failure metric")
	}
}

// A job delivered twice: one inbox row, one WebSocket message, one duplicate
// counted.
func TestDuplicateDeliveryShownOnce(t *testing.T) {
	t.Parallel()
	h, cons, work := startBoth(t)
	w := chattest.Watch(t, work.base, 5)
	m := chattest.Send(t, cons.base, 5, "only once")
	w.WaitSeqs(t, chat.Consumers, 1, 10*time.Second)
	// Deliver the same job again, bypassing the publisher's dedupe key.
	// The relay deleted the published outbox row; the payload is the
	// message's JSON.
	payload, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	rdb := testenv.Redis(t)
	keys := redisq.NewKeys(h.Prefix, chat.QueueName(chat.Consumers))
	if err := rdb.XAdd(context.Background(), chattest.XAddArgs(keys.Stream, m.ID, payload)).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "duplicate recorded", func() bool {
		return h.Count(t, `SELECT count(*) FROM workers.inbox_duplicates`) == 1
	})
	chattest.Send(t, cons.base, 5, "next") // a later message proves the socket is live
	w.WaitSeqs(t, chat.Consumers, 2, 10*time.Second)
	if n := h.Count(t, `SELECT count(*) FROM workers.inbox`); n != 2 {
		t.Fatalf("inbox has %d rows, want 2", n)
	}
}

// The worker dies after the inbox commit and before XACK: the job comes back
// to the restarted worker (same consumer name, own pending first) and is
// skipped as a duplicate; the live client saw the message once.
func TestWorkerCrashAfterCommitBeforeAck(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	cons := h.start(chat.Consumers, nil)
	api := h.start(chat.Workers, func(c *Config) { c.Roles = []string{RoleAPI, RoleRelay} })
	w := chattest.Watch(t, api.base, 6)
	crashed := make(chan struct{})
	var once sync.Once
	worker := h.start(chat.Workers, func(c *Config) {
		c.Roles = []string{RoleWorker}
		c.Worker.ConsumerName = "workers-test"
		c.Hooks = testHooks{source: func(s inbox.Source) inbox.Source {
			return ackFails{Source: s, onAck: func() { once.Do(func() { close(crashed) }) }}
		}}
	})
	chattest.Send(t, cons.base, 6, "crash on my ack")
	<-crashed
	worker.stop() // the process "dies": the ack never happened
	w.WaitSeqs(t, chat.Consumers, 1, 10*time.Second)
	h.start(chat.Workers, func(c *Config) { c.Roles = []string{RoleWorker}; c.Worker.ConsumerName = "workers-test" })
	testenv.WaitFor(t, 15*time.Second, "duplicate skipped after restart", func() bool {
		return h.Count(t, `SELECT count(*) FROM workers.inbox_duplicates`) == 1
	})
	chattest.Send(t, cons.base, 6, "after")
	w.WaitSeqs(t, chat.Consumers, 2, 10*time.Second)
}

// ackFails never acknowledges: as if the process died right before XACK.
type ackFails struct {
	inbox.Source
	onAck func()
}

func (a ackFails) Ack(context.Context, ...string) error {
	a.onAck()
	return errors.New("simulated crash before ack")
}

// Two relays at once (a rolling deploy): per-chat order holds, nothing lost
// or duplicated.
func TestTwoRelaysKeepPerChatOrder(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	cons := h.startAPI(chat.Consumers, nil)
	h.start(chat.Consumers, func(c *Config) { c.Roles = []string{RoleRelay} })
	h.start(chat.Consumers, func(c *Config) { c.Roles = []string{RoleRelay} })
	work := h.start(chat.Workers, nil)
	const chats, per = 4, 25
	ws := make([]*chattest.Watcher, chats)
	for c := range ws {
		ws[c] = chattest.Watch(t, work.base, int64(c+1))
	}
	var wg sync.WaitGroup
	for c := 0; c < chats; c++ {
		for s := 0; s < 2; s++ { // two concurrent senders per chat
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < per/2+s; i++ { // 12 + 13 = 25
					chattest.Send(t, cons.base, int64(c+1), fmt.Sprintf("c%d s%d i%d", c, s, i))
				}
			}()
		}
	}
	wg.Wait()
	for c := range ws {
		ws[c].WaitSeqs(t, chat.Consumers, per, 20*time.Second)
	}
	// The stream itself carries each chat in seq order.
	rdb := testenv.Redis(t)
	entries, err := rdb.XRange(context.Background(), redisq.NewKeys(h.Prefix, chat.QueueName(chat.Consumers)).Stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	last := map[int64]int64{}
	for _, e := range entries {
		p, _ := e.Values["payload"].(string)
		m, err := chat.DecodeEvent([]byte(p))
		if err != nil {
			continue // trimmed stream: only what is left
		}
		if m.Seq <= last[m.ChatID] {
			t.Fatalf("stream order broken in chat %d: seq %d after %d", m.ChatID, m.Seq, last[m.ChatID])
		}
		last[m.ChatID] = m.Seq
	}
}

// The consumers role cannot read the workers' schema, and the reverse.
func TestRolesAreConfinedToTheirSchema(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	for _, s := range []string{chat.Consumers, chat.Workers} {
		_, err := h.RolePool(t, s).Exec(context.Background(), `SELECT count(*) FROM `+chat.Peer(s)+`.inbox`)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Fatalf("%s reading %s.inbox: err %v, want permission denied (42501)", s, chat.Peer(s), err)
		}
	}
}

// Two API processes of one service (a rolling deploy): a client of one sees
// the messages sent through the other at NOTIFY speed, each once — the
// gateway ignores only its own process's outbox notifications.
func TestOwnSendsReachClientsOfAnotherAPIProcess(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	a := h.startAPI(chat.Consumers, nil)
	b := h.startAPI(chat.Consumers, nil)
	// Each within 400 ms, one after another: the gateway's 1 s poll could
	// bring at most one of them that fast, so the NOTIFY carried them.
	w := sendsArrive(t, a, b, 8, 400*time.Millisecond)
	chattest.Send(t, a.base, 8, "via a")
	w.WaitSeqs(t, chat.Consumers, 4, 5*time.Second)
}

// getStatus GETs u and returns the status and body.
func getStatus(t testing.TB, u string) (int, string) {
	t.Helper()
	code, b, err := chattest.Answer(http.Get(u))
	if err != nil {
		t.Fatal(err)
	}
	return code, string(b)
}

// The receiver's receipts come back: the sender's messages get delivered_at
// in the database, in the history and in a live receipt frame, and a socket
// opened later gets the watermark first.
func TestReceiptsMarkMessagesDelivered(t *testing.T) {
	t.Parallel()
	h, cons, _ := startBoth(t)
	w := chattest.Watch(t, cons.base, 8)
	for i := 1; i <= 5; i++ {
		chattest.Send(t, cons.base, 8, fmt.Sprintf("m%d", i))
	}
	testenv.WaitFor(t, 15*time.Second, "a receipt frame up to seq 5 on the sender's socket", func() bool {
		return w.LastReceipt(chat.Consumers).UptoSeq == 5
	})
	if n := h.Count(t, `SELECT count(*) FROM consumers.messages_with_receipts WHERE chat_id = 8 AND delivered_at IS NOT NULL`); n != 5 {
		t.Fatalf("%d of 5 messages have delivered_at", n)
	}
	// delivered_at is the receiver's inbox commit time: never before the send.
	if n := h.Count(t, `SELECT count(*) FROM consumers.messages_with_receipts m JOIN workers.inbox i ON i.message_id = m.id
		WHERE m.chat_id = 8 AND m.delivered_at >= m.created_at AND m.delivered_at <= i.received_at + interval '1 second'`); n != 5 {
		t.Fatalf("%d of 5 messages have a delivered_at between their send and the receipt", n)
	}
	resp, err := chattest.AuthClient.Get(cons.base + "/api/chats/8/messages")
	if err != nil {
		t.Fatal(err)
	}
	var hist struct{ Messages []chat.Message }
	err = json.NewDecoder(resp.Body).Decode(&hist)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(hist.Messages) != 5 {
		t.Fatalf("history has %d messages, want 5", len(hist.Messages))
	}
	for _, m := range hist.Messages {
		if m.DeliveredAt == nil {
			t.Fatalf("history message %d has no delivered_at", m.Seq)
		}
	}
	late := chattest.Watch(t, cons.base, 8)
	testenv.WaitFor(t, 10*time.Second, "the watermark on a new socket", func() bool {
		return late.LastReceipt(chat.Consumers).UptoSeq == 5
	})
	late.WaitSeqs(t, chat.Consumers, 5, 10*time.Second)
	for _, m := range late.From(chat.Consumers) {
		if m.DeliveredAt == nil {
			t.Fatalf("catch-up frame of seq %d has no delivered_at", m.Seq)
		}
	}
}
