package receive

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/inbox"
)

// listen opens a connection of its own on h's database that LISTENs on
// channels: another process's gateway.
func listen(t *testing.T, h *chattest.Harness, channels ...string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, h.AdminURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	for _, ch := range channels {
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			t.Fatal(err)
		}
	}
	return conn
}

// next waits up to 10 s for conn's next notification.
func next(t *testing.T, conn *pgx.Conn) *pgconn.Notification {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := conn.WaitForNotification(ctx)
	if err != nil {
		t.Fatalf("no notification: %v", err)
	}
	return n
}

// marker NOTIFYs channel with payload "marker" from a connection of its
// own, committed after everything the test committed before: a listener
// gets notifications in commit order, so what it gets before the marker
// was sent by those earlier commits.
func marker(t *testing.T, h *chattest.Harness, channel string) {
	t.Helper()
	if _, err := h.Admin.Exec(context.Background(), "SELECT pg_notify($1, 'marker')", channel); err != nil {
		t.Fatal(err)
	}
}

// messageDelivery is a message.created delivery from consumers.
func messageDelivery(chatID, seq int64) inbox.Delivery {
	id := uuid.NewString()
	p, _ := json.Marshal(chat.Message{ID: id, ChatID: chatID, Seq: seq, Body: "b", SentAt: time.Now(), From: chat.Consumers})
	return inbox.Delivery{ID: id, Name: chat.EventMessageCreated, Payload: p, Ref: fmt.Sprint("0-", chatID, seq)}
}

// An inbox commit — messages and a receipt — sends no notification itself:
// a listener on the inbox and receipt channels gets the marker sent after
// the commit first. (Before, the inbox statement and the receipt statement
// each ran pg_notify inside the inbox transaction.)
func TestInboxCommitSendsNoNotify(t *testing.T) {
	t.Parallel()
	h := chattest.New(t, "")
	ctx := context.Background()
	_, _, c, _ := inboxConsumer(t, h, chat.Workers, nil)
	_, _, cc, _ := inboxConsumer(t, h, chat.Consumers, nil)
	inboxL := listen(t, h, chat.InboxChannel(chat.Workers))
	receiptL := listen(t, h, chat.ReceiptChannel(chat.Consumers))

	if err := c.ProcessBatch(ctx, []inbox.Delivery{messageDelivery(4, 1), messageDelivery(5, 1)}); err != nil {
		t.Fatal(err)
	}
	rid := uuid.NewString()
	rp, _ := json.Marshal(chat.Receipt{ID: rid, From: chat.Workers, ReceivedAt: time.Now(), Chats: []chat.ReceiptChat{{ChatID: 4, UptoSeq: 1}}})
	if err := cc.ProcessBatch(ctx, []inbox.Delivery{{ID: rid, Name: chat.EventReceipt, Payload: rp, Ref: "0-9"}}); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Applied != 2 {
		t.Fatalf("workers inbox applied %d, want 2", st.Applied)
	}
	if st := cc.Stats(); st.Applied != 1 {
		t.Fatalf("consumers receipts applied %d, want 1", st.Applied)
	}
	marker(t, h, chat.InboxChannel(chat.Workers))
	marker(t, h, chat.ReceiptChannel(chat.Consumers))
	if n := next(t, inboxL); n.Payload != "marker" {
		t.Errorf("the inbox commit notified %s with %q inside its transaction", n.Channel, n.Payload)
	}
	if n := next(t, receiptL); n.Payload != "marker" {
		t.Errorf("the receipt commit notified %s with %q inside its transaction", n.Channel, n.Payload)
	}
}

// The Waker, fed by inbox.Config.AfterCommit, reaches a listener on
// another connection (another process's gateway) after the commit: one
// notification naming every chat that got rows, one with the receipts;
// commits made while it is stopped are coalesced into one wake-up at Start.
func TestWakerReachesAnotherListenerCoalesced(t *testing.T) {
	t.Parallel()
	h := chattest.New(t, "")
	ctx := context.Background()
	pool := h.RolePool(t, chat.Workers)
	w, err := NewWaker(pool, chat.Workers, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _, c, _ := inboxConsumer(t, h, chat.Workers, &inbox.Config{AfterCommit: w.Committed})
	l := listen(t, h, chat.InboxChannel(chat.Workers), chat.ReceiptChannel(chat.Workers))

	// Three batches commit before the Waker runs.
	for i, chats := range [][]int64{{3, 7}, {7}, {12}} {
		var ds []inbox.Delivery
		for _, ch := range chats {
			ds = append(ds, messageDelivery(ch, int64(i+1)))
		}
		if err := c.ProcessBatch(ctx, ds); err != nil {
			t.Fatal(err)
		}
	}
	at := time.UnixMicro(time.Now().UnixMicro())
	w.Committed([]inbox.Applied{{Value: chat.Receipt{ReceivedAt: at, Chats: []chat.ReceiptChat{{ChatID: 3, UptoSeq: 9}}}}})
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer w.Stop(ctx)

	got := map[string]string{}
	for range 2 {
		n := next(t, l)
		if _, dup := got[n.Channel]; dup {
			t.Fatalf("a second wake-up on %s (%q): the commits were not coalesced", n.Channel, n.Payload)
		}
		got[n.Channel] = n.Payload
	}
	ids := strings.Split(got[chat.InboxChannel(chat.Workers)], ",")
	slices.Sort(ids)
	if !slices.Equal(ids, []string{"12", "3", "7"}) {
		t.Errorf("inbox wake-up names chats %q, want 3, 7 and 12", ids)
	}
	if want := fmt.Sprintf("3:9:%d", at.UnixMicro()); got[chat.ReceiptChannel(chat.Workers)] != want {
		t.Errorf("receipt wake-up %q, want %q", got[chat.ReceiptChannel(chat.Workers)], want)
	}

	// A delivery without a stored Message (a wrapping handler's) still
	// names its chat; one that cannot be decoded wakes every chat ("").
	w.Committed([]inbox.Applied{{Delivery: messageDelivery(21, 1)}})
	if n := next(t, l); n.Payload != "21" {
		t.Errorf("wake-up from the delivery's payload %q, want \"21\"", n.Payload)
	}
	fp, _ := json.Marshal(chat.Receipt{ID: uuid.NewString(), From: chat.Consumers, ReceivedAt: time.Now(), Chats: []chat.ReceiptChat{{ChatID: 33, UptoSeq: 4}}})
	w.Committed([]inbox.Applied{{Delivery: inbox.Delivery{Name: chat.EventSeqFloor, Payload: fp}}})
	if n := next(t, l); n.Channel != chat.InboxChannel(chat.Workers) || n.Payload != "33" {
		t.Errorf("wake-up for a seq floor %s %q, want the inbox channel with \"33\"", n.Channel, n.Payload)
	}
	w.Committed([]inbox.Applied{{Delivery: inbox.Delivery{Name: chat.EventMessageCreated, Payload: []byte("{")}}})
	if n := next(t, l); n.Payload != "" {
		t.Errorf("wake-up for an undecodable delivery %q, want \"\" (any chat)", n.Payload)
	}
}

// A long list of chats is split into notifications under Postgres's 8000
// byte payload limit instead of failing.
func TestWakerSplitsLongPayloads(t *testing.T) {
	t.Parallel()
	h := chattest.New(t, "")
	ctx := context.Background()
	w, err := NewWaker(h.RolePool(t, chat.Workers), chat.Workers, nil)
	if err != nil {
		t.Fatal(err)
	}
	l := listen(t, h, chat.InboxChannel(chat.Workers))
	var applied []inbox.Applied
	for id := int64(1_000_000_000); id < 1_000_000_000+2000; id++ {
		applied = append(applied, inbox.Applied{Value: chat.Message{ChatID: id}})
	}
	w.Committed(applied)
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer w.Stop(ctx)
	seen := 0
	for seen < 2000 {
		n := next(t, l)
		if len(n.Payload) >= 8000 {
			t.Fatalf("payload of %d bytes", len(n.Payload))
		}
		seen += len(strings.Split(n.Payload, ","))
	}
	if seen != 2000 {
		t.Fatalf("%d chats woken, want 2000", seen)
	}
}

// With an Interval, commits made within it after a wake-up wait for the
// next one and share it; Stop sends what is pending at once.
func TestWakerIntervalCoalescesAndStopFlushes(t *testing.T) {
	t.Parallel()
	h := chattest.New(t, "")
	ctx := context.Background()
	w, err := NewWaker(h.RolePool(t, chat.Workers), chat.Workers, &WakerConfig{Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	l := listen(t, h, chat.InboxChannel(chat.Workers))
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	w.Committed([]inbox.Applied{{Value: chat.Message{ChatID: 1}}})
	if n := next(t, l); n.Payload != "1" {
		t.Fatalf("first wake-up %q, want \"1\"", n.Payload)
	}
	w.Committed([]inbox.Applied{{Value: chat.Message{ChatID: 2}}})
	w.Committed([]inbox.Applied{{Value: chat.Message{ChatID: 3}}})
	if err := w.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if n := next(t, l); n.Payload != "2,3" {
		t.Fatalf("wake-up after the interval %q, want \"2,3\" (both commits in one)", n.Payload)
	}
}

// take's payloads: every chat once, in order, comma-separated, each
// payload at most maxNotePayload bytes and as full as the next item
// allows; receipts as chat:upto:micros on their own channel.
func TestWakerTakeSplitsAndFormats(t *testing.T) {
	t.Parallel()
	h := chattest.New(t, "")
	w, err := NewWaker(h.RolePool(t, chat.Workers), chat.Workers, nil)
	if err != nil {
		t.Fatal(err)
	}
	at := time.UnixMicro(1_795_000_000_123456)
	var applied []inbox.Applied
	var want []string
	for id := int64(1_000_000_000); id < 1_000_000_000+3000; id++ {
		applied = append(applied, inbox.Applied{Value: chat.Message{ChatID: id}})
		want = append(want, fmt.Sprint(id))
	}
	applied = append(applied, inbox.Applied{Value: chat.Receipt{ReceivedAt: at,
		Chats: []chat.ReceiptChat{{ChatID: 9, UptoSeq: 4}, {ChatID: 2, UptoSeq: 7}}}})
	w.Committed(applied)
	channels, payloads := w.take()
	var got []string
	var receipts []string
	for i, p := range payloads {
		if len(p) > maxNotePayload {
			t.Fatalf("payload %d: %d bytes", i, len(p))
		}
		switch channels[i] {
		case chat.InboxChannel(chat.Workers):
			if i+1 < len(payloads) && channels[i+1] == channels[i] && len(p)+1+len("1000000000") <= maxNotePayload {
				t.Fatalf("payload %d (%d bytes) split before it was full", i, len(p))
			}
			got = append(got, strings.Split(p, ",")...)
		case chat.ReceiptChannel(chat.Workers):
			receipts = append(receipts, p)
		default:
			t.Fatalf("channel %q", channels[i])
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("chats: %d items, want %d in order", len(got), len(want))
	}
	if wantR := []string{"2:7:1795000000123456,9:4:1795000000123456"}; !slices.Equal(receipts, wantR) {
		t.Fatalf("receipts %q, want %q", receipts, wantR)
	}
	if c, p := w.take(); len(c) != 0 || len(p) != 0 {
		t.Fatalf("second take: %q %q, want nothing", c, p)
	}
}
