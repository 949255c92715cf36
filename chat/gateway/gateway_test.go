package gateway

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/internal/testenv"
)

// offerGateway is a started gateway on h's workers schema that hears no
// NOTIFY and polls once an hour: only Subscribe's read, Offer and what Offer
// makes it read can push anything.
func offerGateway(t *testing.T, h *chattest.Harness) *Gateway {
	t.Helper()
	return offerGatewayBuffer(t, h, 0)
}

// offerGatewayBuffer is offerGateway with Config.ClientBuffer buffer (0:
// the default).
func offerGatewayBuffer(t *testing.T, h *chattest.Harness, buffer int) *Gateway {
	t.Helper()
	g, err := New(h.Admin, chat.Workers, &Config{Channels: []string{"nobody_notifies_this"}, PollInterval: time.Hour, ClientBuffer: buffer})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Stop(context.Background()) })
	return g
}

// storeReceived inserts a received message into workers.inbox without a
// NOTIFY and returns it as stored.
func storeReceived(t testing.TB, h *chattest.Harness, chatN, seq int64) chat.Message {
	t.Helper()
	m := chat.Message{ID: uuid.NewString(), ChatID: chatN, Seq: seq, Body: "m", From: chat.Consumers}
	var at time.Time
	err := h.Admin.QueryRow(context.Background(), `INSERT INTO workers.inbox (message_id, chat_id, seq, body, sender, sent_at)
		VALUES ($1, $2, $3, $4, $5, now()) RETURNING sent_at, received_at`, m.ID, chatN, seq, m.Body, m.From).Scan(&m.SentAt, &at)
	if err != nil {
		t.Fatal(err)
	}
	m.ReceivedAt = &at
	return m
}

// storeSent inserts a sent message into workers.messages and returns it.
func storeSent(t *testing.T, h *chattest.Harness, chatN, seq int64) chat.Message {
	t.Helper()
	m := chat.Message{ID: uuid.NewString(), ChatID: chatN, Seq: seq, Body: "s", From: chat.Workers}
	err := h.Admin.QueryRow(context.Background(), `INSERT INTO workers.messages (id, chat_id, seq, body)
		VALUES ($1, $2, $3, $4) RETURNING created_at`, m.ID, chatN, seq, m.Body).Scan(&m.SentAt)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// nextFrames reads n frames from s and returns their "from:seq" labels.
func nextFrames(t *testing.T, s *Subscription, n int) []string {
	t.Helper()
	var got []string
	for range n {
		select {
		case b := <-s.C:
			m, err := chat.DecodeEvent(b)
			if err != nil {
				t.Fatalf("frame %s: %v", b, err)
			}
			got = append(got, m.From+":"+strconv.FormatInt(m.Seq, 10))
		case <-time.After(5 * time.Second):
			t.Fatalf("got frames %v, then nothing for 5 s (want %d)", got, n)
		}
	}
	return got
}

// wantFrames reads the frames want lists ("from:seq" labels,
// space-separated) from s and fails unless they come in that order.
func wantFrames(t *testing.T, s *Subscription, want string) {
	t.Helper()
	if got := strings.Join(nextFrames(t, s, len(strings.Fields(want))), " "); got != want {
		t.Fatalf("frames %q, want %q", got, want)
	}
}

// offerRoom is a test's harness and offer gateway with one subscriber of
// room chatID, closed when the test ends.
func offerRoom(t *testing.T, chatID int64) (*chattest.Harness, *Gateway, *Subscription) {
	t.Helper()
	h := chattest.New(t, "")
	g := offerGateway(t, h)
	s := g.Subscribe(chatID, 0, 0)
	t.Cleanup(s.Close)
	return h, g, s
}

// noFrame fails if s gets a frame within d.
func noFrame(t *testing.T, s *Subscription, d time.Duration) {
	t.Helper()
	select {
	case b := <-s.C:
		t.Fatalf("unexpected frame %s", b)
	case <-time.After(d):
	}
}

// Offered rows reach subscribers without any NOTIFY or poll, once each; a
// room without subscribers drops them and a later subscriber reads them.
func TestGatewayOfferPushesCommittedRows(t *testing.T) {
	t.Parallel()
	h, g, s := offerRoom(t, 21)
	g.Offer(true, []chat.Message{storeReceived(t, h, 21, 1), storeReceived(t, h, 21, 2)})
	g.Offer(false, []chat.Message{storeSent(t, h, 21, 1)})
	got := strings.Join(nextFrames(t, s, 3), " ")
	if got != "consumers:1 consumers:2 workers:1" && got != "workers:1 consumers:1 consumers:2" {
		t.Fatalf("frames %q, want each message once, each origin in seq order", got)
	}
	g.Offer(true, []chat.Message{storeReceived(t, h, 22, 1)}) // nobody in room 22
	late := g.Subscribe(22, 0, 0)
	defer late.Close()
	wantFrames(t, late, "consumers:1")
	noFrame(t, s, 100*time.Millisecond)
	noFrame(t, late, 0)
}

// A subscriber whose cursor is behind the first offered row does not get
// the offered rows out of order: the gateway reads the room instead (the
// missing rows are committed, just not offered), for either origin.
func TestGatewayOfferBehindCursorReadsTheRoom(t *testing.T) {
	t.Parallel()
	h, g, s := offerRoom(t, 23)
	g.Offer(true, []chat.Message{storeReceived(t, h, 23, 1)})
	wantFrames(t, s, "consumers:1")
	storeReceived(t, h, 23, 2) // committed, never offered (another process's inbox commit whose NOTIFY is late)
	g.Offer(true, []chat.Message{storeReceived(t, h, 23, 3)})
	if got := strings.Join(nextFrames(t, s, 2), " "); got != "consumers:2 consumers:3" {
		t.Fatalf("frames %q, want consumers:2 consumers:3", got)
	}
	// Sends: ours 1, another process's 2 (not offered here), ours 3.
	g.Offer(false, []chat.Message{storeSent(t, h, 23, 1)})
	wantFrames(t, s, "workers:1")
	storeSent(t, h, 23, 2)
	g.Offer(false, []chat.Message{storeSent(t, h, 23, 3)})
	if got := strings.Join(nextFrames(t, s, 2), " "); got != "workers:2 workers:3" {
		t.Fatalf("frames %q, want workers:2 workers:3", got)
	}
	noFrame(t, s, 100*time.Millisecond)
}

// A worker whose handler returns no stored row (a plain inbox.Handler, as
// the lab's fault wrapper is) still gets its rows pushed: offerApplied
// wakes their rooms, since the gateway ignores its own process's NOTIFYs.
func TestGatewayOfferAppliedWithoutRow(t *testing.T) {
	t.Parallel()
	h, g, s := offerRoom(t, 24)
	m := storeReceived(t, h, 24, 1)
	payload, err := json.Marshal(chat.Message{ID: m.ID, ChatID: m.ChatID, Seq: m.Seq, Body: m.Body, SentAt: m.SentAt, From: m.From})
	if err != nil {
		t.Fatal(err)
	}
	g.OfferApplied([]inbox.Applied{{Delivery: inbox.Delivery{ID: m.ID, Name: chat.EventMessageCreated, Payload: payload}}})
	wantFrames(t, s, "consumers:1")
}

// One id on both sides of a room (a faulty or forged peer reusing one of
// ours) still shows each message once: frames are keyed by origin and id.
func TestGatewaySameIDBothSides(t *testing.T) {
	t.Parallel()
	h := chattest.New(t, "")
	g := offerGateway(t, h)
	id := uuid.NewString()
	ctx := context.Background()
	if _, err := h.Admin.Exec(ctx, `INSERT INTO workers.messages (id, chat_id, seq, body) VALUES ($1, 25, 1, 'ours')`, id); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Admin.Exec(ctx, `INSERT INTO workers.inbox (message_id, chat_id, seq, body, sender, sent_at)
		VALUES ($1, 25, 1, 'theirs', 'consumers', now())`, id); err != nil {
		t.Fatal(err)
	}
	s := g.Subscribe(25, 0, 0)
	defer s.Close()
	got := nextFrames(t, s, 2)
	slices.Sort(got)
	if !slices.Equal(got, []string{"consumers:1", "workers:1"}) {
		t.Fatalf("frames %v, want one of each side", got)
	}
}

// A subscriber holding a gap with more than a page of messages past it
// neither holds back the other subscribers of the room nor makes the
// gateway re-read that page over and over; once the gap closes it catches
// up at once, in seq order.
func TestGatewayGapPastAPageDoesNotStallOthers(t *testing.T) {
	t.Parallel()
	h := chattest.New(t, "")
	ctx := context.Background()
	// Received seqs 2..600 of chat 31: seq 1 is missing.
	if _, err := h.Admin.Exec(ctx, `INSERT INTO workers.inbox (message_id, chat_id, seq, body, sender, sent_at)
		SELECT gen_random_uuid(), 31, s, 'm', 'consumers', now() FROM generate_series(2, 600) AS s`); err != nil {
		t.Fatal(err)
	}
	g := offerGateway(t, h) // GapTimeout 60 s, poll 1 h
	behind := g.Subscribe(31, 0, 0)
	defer behind.Close()
	current := g.Subscribe(31, 0, 600)
	defer current.Close()
	var reads0 int64
	if err := h.Admin.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`).Scan(&reads0); err != nil {
		t.Fatal(err)
	}
	g.Offer(true, []chat.Message{storeReceived(t, h, 31, 601)})
	wantFrames(t, current, "consumers:601")
	noFrame(t, behind, 200*time.Millisecond) // still holding behind seq 1
	var reads1 int64
	if err := h.Admin.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`).Scan(&reads1); err != nil {
		t.Fatal(err)
	}
	if n := reads1 - reads0; n > 50 {
		t.Fatalf("%d transactions in the database while one subscriber held a gap: the gateway is re-reading in a loop", n)
	}
	g.Offer(true, []chat.Message{storeReceived(t, h, 31, 1)})
	got := nextFrames(t, behind, 601)
	for i, f := range got {
		if want := "consumers:" + strconv.Itoa(i+1); f != want {
			t.Fatalf("frame %d is %s, want %s", i, f, want)
		}
	}
	noFrame(t, current, 100*time.Millisecond)
}

// bulkReceived inserts received seqs from..to of chat into workers.inbox,
// without a NOTIFY.
func bulkReceived(t *testing.T, h *chattest.Harness, chatN, from, to int64) {
	t.Helper()
	if _, err := h.Admin.Exec(context.Background(), `INSERT INTO workers.inbox (message_id, chat_id, seq, body, sender, sent_at)
		SELECT gen_random_uuid(), $1, s, 'm', 'consumers', now() FROM generate_series($2::bigint, $3::bigint) AS s`, chatN, from, to); err != nil {
		t.Fatal(err)
	}
}

// wantSeqs fails unless frames are consumers:from … consumers:to in order.
func wantSeqs(t *testing.T, frames []string, from int64) {
	t.Helper()
	for i, f := range frames {
		if want := "consumers:" + strconv.FormatInt(from+int64(i), 10); f != want {
			t.Fatalf("frame %d is %s, want %s", i, f, want)
		}
	}
}

// Two subscribers holding different gaps more than a page apart: the one
// whose gap closes gets its messages at once, not when the other's hold
// times out.
func TestGatewayHoldersReadFromTheirOwnCursors(t *testing.T) {
	t.Parallel()
	h := chattest.New(t, "")
	bulkReceived(t, h, 41, 2, 700) // 1 missing
	bulkReceived(t, h, 41, 702, 710)
	g := offerGateway(t, h)
	low := g.Subscribe(41, 0, 0) // holds behind 1
	defer low.Close()
	noFrame(t, low, 300*time.Millisecond)
	high := g.Subscribe(41, 0, 700) // holds behind 701
	defer high.Close()
	noFrame(t, high, 300*time.Millisecond)
	g.Offer(true, []chat.Message{storeReceived(t, h, 41, 701)})
	wantSeqs(t, nextFrames(t, high, 10), 701)
	noFrame(t, low, 100*time.Millisecond)
}

// A subscriber that runs into a gap at the head of a full page does not
// hold back another subscriber more than a page ahead of it.
func TestGatewayNewGapDoesNotHoldBackOthers(t *testing.T) {
	t.Parallel()
	h := chattest.New(t, "")
	bulkReceived(t, h, 43, 1, 100)
	g := offerGateway(t, h)
	low := g.Subscribe(43, 0, 0)
	defer low.Close()
	wantSeqs(t, nextFrames(t, low, 100), 1)
	high := g.Subscribe(43, 0, 700) // has seen up to 700 (from the history, say)
	defer high.Close()
	noFrame(t, high, 300*time.Millisecond) // its first read is done: one read follows the Wake below
	bulkReceived(t, h, 43, 102, 1000)      // 101 still in flight
	g.Wake(43)
	wantSeqs(t, nextFrames(t, high, 300), 701)
	noFrame(t, low, 100*time.Millisecond)
}

// A subscriber that falls behind past its channel (subscriberChan frames)
// but not past ClientBuffer keeps its place: once it reads, it gets every
// frame once and in order, and the backlog is released. One that falls
// more than ClientBuffer frames behind is evicted.
func TestGatewaySlowSubscriberBacklog(t *testing.T) {
	t.Parallel()
	const rows = 300
	h := chattest.New(t, "")
	for seq := int64(1); seq <= rows; seq++ {
		storeReceived(t, h, 1, seq)
	}
	s := offerGatewayBuffer(t, h, rows+50).Subscribe(1, 0, 0)
	defer s.Close()
	// Nothing reads until every frame is queued: the channel holds
	// subscriberChan, the backlog the rest (the pump may hold one).
	testenv.WaitFor(t, 10*time.Second, "all frames queued", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.c)+len(s.backlog) >= rows-1
	})
	if cap(s.c) != subscriberChan {
		t.Fatalf("channel of %d slots, want %d", cap(s.c), subscriberChan)
	}
	want := make([]string, rows)
	for i := range want {
		want[i] = chat.Consumers + ":" + strconv.Itoa(i+1)
	}
	if got := nextFrames(t, s, rows); !slices.Equal(got, want) {
		t.Fatalf("frames %v, want consumers:1 … consumers:%d in order", got, rows)
	}
	select {
	case <-s.Evicted:
		t.Fatal("a subscriber within ClientBuffer was evicted")
	default:
	}
	testenv.WaitFor(t, 10*time.Second, "backlog released", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return !s.pumping.Load() && s.backlog == nil
	})
	noFrame(t, s, 100*time.Millisecond)

	slow := offerGatewayBuffer(t, h, rows/3).Subscribe(1, 0, 0)
	defer slow.Close()
	select {
	case <-slow.Evicted:
	case <-time.After(10 * time.Second):
		t.Fatalf("a subscriber %d frames behind with ClientBuffer %d was not evicted", rows, rows/3)
	}
}
