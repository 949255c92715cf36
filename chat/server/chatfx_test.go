package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/auth"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/redisq"
)

// tokenOf mints a test token of user for every chat (or the given ones).
func tokenOf(t testing.TB, user string, chats ...int64) string {
	t.Helper()
	scope := auth.ChatScope{All: len(chats) == 0, IDs: chats}
	tok, err := auth.MintToken(chattest.Secret, user, []string{chat.Consumers, chat.Workers}, scope, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// call sends method to u with token and a JSON body ("" for none) and
// returns the status and body.
func call(t testing.TB, method, u, token, body string) (int, []byte) {
	t.Helper()
	var rd *bytes.Reader
	if body != "" {
		rd = bytes.NewReader([]byte(body))
	} else {
		rd = bytes.NewReader(nil)
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	code, b, err := chattest.Answer(http.DefaultClient.Do(req))
	if err != nil {
		t.Fatal(err)
	}
	return code, b
}

type latestPage struct {
	Messages        []chat.Message `json:"messages"`
	MoreBefore      bool           `json:"more_before"`
	BeforeConsumers int64          `json:"before_consumers"`
	BeforeWorkers   int64          `json:"before_workers"`
}

func getLatest(t testing.TB, u string) latestPage {
	t.Helper()
	code, b := call(t, "GET", u, chattest.Token(), "")
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", u, code, b)
	}
	var p latestPage
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatal(err)
	}
	return p
}

// bulkChat stores n messages of each origin in chat chatID on workers'
// side, as if they had been sent and received long ago (both sides'
// receipts say delivered, so nothing is re-driven): workers' own messages
// at even milliseconds, consumers' (in workers.inbox) at odd ones.
func bulkChat(t testing.TB, h *harness, chatID int64, n int) {
	t.Helper()
	ctx := context.Background()
	for _, q := range []string{
		`INSERT INTO workers.messages (chat_id, seq, body, author, created_at)
			SELECT $1, g, 'workers ' || g, 'tester', timestamptz '2026-01-01' + (2 * g) * interval '1 ms' FROM generate_series(1, $2) g`,
		`INSERT INTO workers.receipts (chat_id, upto_seq, delivered_at) VALUES ($1, $2, now())`,
		`INSERT INTO workers.inbox (message_id, chat_id, seq, body, sender, sent_at, author)
			SELECT gen_random_uuid(), $1, g, 'consumers ' || g, 'consumers', timestamptz '2026-01-01' + (2 * g + 1) * interval '1 ms', 'tester'
			FROM generate_series(1, $2) g`,
		`INSERT INTO consumers.seq_floors (chat_id, seq) VALUES ($1, $2)`,
	} {
		if _, err := h.Admin.Exec(ctx, q, chatID, n); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// A chat of 100,000 messages opens at its newest: the history's last=50
// is the newest 50 of both sides merged, oldest first, and pages back
// without a gap or a repeat; a socket opened with last=50 gets exactly
// those 50 frames, then live ones; a reconnect with cursors catches up
// exactly.
func TestLatestFirstOnALongChat(t *testing.T) {
	h, cons, work := startBoth(t)
	const chatID = 4242
	bulkChat(t, h, chatID, 50000)
	base := fmt.Sprintf("%s/api/chats/%d/messages", work.base, chatID)

	p := getLatest(t, base+"?last=50")
	if len(p.Messages) != 50 || !p.MoreBefore {
		t.Fatalf("last=50: %d messages, more_before %v", len(p.Messages), p.MoreBefore)
	}
	// The newest 50: workers 49976..50000 and consumers 49976..50000,
	// interleaved by sent_at, oldest first.
	for i, m := range p.Messages {
		wantSeq := int64(49976 + i/2)
		wantFrom := chat.Workers
		if i%2 == 1 {
			wantFrom = chat.Consumers
		}
		if m.Seq != wantSeq || m.From != wantFrom || m.Version != 1 {
			t.Fatalf("message %d: %s seq %d v%d, want %s seq %d", i, m.From, m.Seq, m.Version, wantFrom, wantSeq)
		}
	}
	if p.BeforeWorkers != 49976 || p.BeforeConsumers != 49976 {
		t.Fatalf("cursors %d/%d, want 49976/49976", p.BeforeConsumers, p.BeforeWorkers)
	}
	// Page back three times: contiguous, no repeats.
	seen := map[string]bool{}
	for _, m := range p.Messages {
		seen[m.From+fmt.Sprint(m.Seq)] = true
	}
	next := p
	for page := 0; page < 3; page++ {
		next = getLatest(t, fmt.Sprintf("%s?last=50&before_consumers=%d&before_workers=%d", base, next.BeforeConsumers, next.BeforeWorkers))
		if len(next.Messages) != 50 || !next.MoreBefore {
			t.Fatalf("page %d: %d messages, more_before %v", page, len(next.Messages), next.MoreBefore)
		}
		for _, m := range next.Messages {
			k := m.From + fmt.Sprint(m.Seq)
			if seen[k] {
				t.Fatalf("page %d repeats %s", page, k)
			}
			seen[k] = true
		}
	}
	if len(seen) != 200 || !seen["workers49901"] || !seen["consumers49901"] {
		t.Fatalf("4 pages hold %d messages, want the newest 200", len(seen))
	}
	// The oldest page says there is nothing before it.
	first := getLatest(t, base+"?last=10&before_consumers=3&before_workers=3")
	if len(first.Messages) != 4 || first.MoreBefore {
		t.Fatalf("oldest page: %d messages, more_before %v", len(first.Messages), first.MoreBefore)
	}
	for _, bad := range []string{"?last=0", "?last=x", "?last=10001", "?last=5&after_seq=3", "?before_workers=-1"} {
		code, b := call(t, "GET", base+bad, chattest.Token(), "")
		if code != http.StatusBadRequest || !bytes.Contains(b, []byte(`"field":"`)) {
			t.Fatalf("%s: %d %s", bad, code, b)
		}
	}

	// The socket: 50 history frames, not 100,000.
	w := chattest.WatchURL(t, context.Background(), fmt.Sprintf("%s/ws?chat_id=%d&last=50", work.base, chatID))
	testenv.WaitFor(t, 20*time.Second, "50 history frames", func() bool { return len(w.Messages()) >= 50 })
	live := chattest.Send(t, cons.base, chatID, "live one")
	testenv.WaitFor(t, 20*time.Second, "the live message", func() bool {
		ms := w.Messages()
		return len(ms) > 0 && ms[len(ms)-1].ID == live.ID
	})
	ms := w.Messages()
	if len(ms) != 51 {
		t.Fatalf("socket got %d message frames, want 50 history + 1 live", len(ms))
	}
	for i, m := range ms[:50] {
		if m.ID != p.Messages[i].ID {
			t.Fatalf("history frame %d is %s seq %d, want %s seq %d", i, m.From, m.Seq, p.Messages[i].From, p.Messages[i].Seq)
		}
	}
	if live.Seq != 50001 {
		t.Fatalf("live message got seq %d", live.Seq)
	}
	// A reconnect with cursors (5 behind on consumers) gets exactly the 5.
	rw := chattest.WatchURL(t, context.Background(), fmt.Sprintf("%s/ws?chat_id=%d&last=50&after_consumers=49996&after_workers=50000", work.base, chatID))
	testenv.WaitFor(t, 20*time.Second, "catch-up", func() bool { return len(rw.Messages()) >= 5 })
	chattest.Send(t, work.base, chatID, "after reconnect")
	testenv.WaitFor(t, 20*time.Second, "own live message", func() bool { return len(rw.Messages()) >= 6 })
	rms := rw.Messages()
	if len(rms) != 6 || rms[0].Seq != 49997 || rms[4].Seq != 50001 || rms[4].From != chat.Consumers || rms[5].From != chat.Workers || rms[5].Seq != 50001 {
		var s []string
		for _, m := range rms {
			s = append(s, fmt.Sprintf("%s:%d", m.From, m.Seq))
		}
		t.Fatalf("reconnect got %v", s)
	}
}

// frameCount reads frames from a socket until quiet for d and returns them.
func dialRaw(t testing.TB, u, token string) *websocket.Conn {
	t.Helper()
	c, _, err := websocket.Dial(context.Background(), "ws"+strings.TrimPrefix(u, "http"), chattest.WSOpts(token))
	if err != nil {
		t.Fatalf("dial %s: %v", u, err)
	}
	t.Cleanup(func() { c.CloseNow() })
	return c
}

// The chat list: the chats the token allows that have messages, newest
// first, paged, with unread counts that follow the reads.
func TestChatListNewestFirstWithUnread(t *testing.T) {
	h, cons, work := startBoth(t)
	for _, id := range []int64{11, 12, 13} {
		chattest.Send(t, cons.base, id, fmt.Sprint("to workers in ", id))
	}
	chattest.Send(t, cons.base, 11, "second in 11")
	testenv.WaitFor(t, 20*time.Second, "workers' inbox", func() bool {
		return h.Count(t, `SELECT count(*) FROM workers.inbox`) == 4
	})
	type list struct {
		Chats []struct {
			ChatID      int64        `json:"chat_id"`
			LastMessage chat.Message `json:"last_message"`
			Unread      int64        `json:"unread"`
		} `json:"chats"`
		NextCursor *string `json:"next_cursor"`
	}
	get := func(u, token string) list {
		t.Helper()
		code, b := call(t, "GET", u, token, "")
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d %s", u, code, b)
		}
		var l list
		if err := json.Unmarshal(b, &l); err != nil {
			t.Fatal(err)
		}
		return l
	}
	l := get(work.base+"/api/chats", chattest.Token())
	if len(l.Chats) != 3 || l.Chats[0].ChatID != 11 || l.Chats[0].Unread != 2 || l.Chats[0].LastMessage.Body != "second in 11" ||
		l.Chats[1].ChatID != 13 || l.Chats[2].ChatID != 12 || l.NextCursor != nil {
		t.Fatalf("chat list: %+v", l)
	}
	// Paged: two, then the third.
	p1 := get(work.base+"/api/chats?limit=2", chattest.Token())
	if len(p1.Chats) != 2 || p1.NextCursor == nil {
		t.Fatalf("page 1: %+v", p1)
	}
	p2 := get(work.base+"/api/chats?limit=2&cursor="+*p1.NextCursor, chattest.Token())
	if len(p2.Chats) != 1 || p2.Chats[0].ChatID != 12 || p2.NextCursor != nil {
		t.Fatalf("page 2: %+v", p2)
	}
	// A token for chats 12 and 99 sees 12 only.
	if l := get(work.base+"/api/chats", tokenOf(t, "tester", 12, 99)); len(l.Chats) != 1 || l.Chats[0].ChatID != 12 {
		t.Fatalf("scoped list: %+v", l)
	}
	// Reading chat 11 up to seq 1 leaves 1 unread; up to 2, none.
	code, b := call(t, "POST", fmt.Sprintf("%s/api/chats/11/read", work.base), chattest.Token(), `{"upto_seq": 1}`)
	if code != http.StatusOK || !bytes.Contains(b, []byte(`"unread":1`)) {
		t.Fatalf("read: %d %s", code, b)
	}
	if l := get(work.base+"/api/chats", chattest.Token()); l.Chats[0].Unread != 1 {
		t.Fatalf("after read 1: %+v", l.Chats[0])
	}
	call(t, "POST", fmt.Sprintf("%s/api/chats/11/read", work.base), chattest.Token(), `{"upto_seq": 99}`)
	if l := get(work.base+"/api/chats", chattest.Token()); l.Chats[0].Unread != 0 {
		t.Fatalf("after read all: %+v", l.Chats[0])
	}
	// Another user's count is their own.
	if l := get(work.base+"/api/chats", tokenOf(t, "someone else")); l.Chats[0].Unread != 2 {
		t.Fatalf("other user: %+v", l.Chats[0])
	}
	for _, bad := range []string{"?limit=0", "?limit=x", "?cursor=nope"} {
		code, b := call(t, "GET", work.base+"/api/chats"+bad, chattest.Token(), "")
		if code != http.StatusBadRequest || !bytes.Contains(b, []byte(`"field":"`)) {
			t.Fatalf("%s: %d %s", bad, code, b)
		}
	}
}

// Edits and deletes through the API: author only, bad input named, each a
// versioned event that the other side applies, with edit and delete frames
// on both sides and the latest version in both histories.
func TestEditAndDeleteReachTheOtherSide(t *testing.T) {
	h, cons, work := startBoth(t)
	const chatID = 31
	wc := chattest.Watch(t, cons.base, chatID)
	ww := chattest.Watch(t, work.base, chatID)
	m := chattest.Send(t, cons.base, chatID, "first words")
	ww.WaitSeqs(t, chat.Consumers, 1, 20*time.Second)
	u := fmt.Sprintf("%s/api/chats/%d/messages/%s", cons.base, chatID, m.ID)
	tok := chattest.Token()
	for _, c := range []struct {
		method, url, token, body string
		code                     int
		field                    string
	}{
		{"PATCH", u, tokenOf(t, "mallory"), `{"body": "hijack"}`, 403, "message_id"},
		{"DELETE", u, tokenOf(t, "mallory"), "", 403, "message_id"},
		{"PATCH", fmt.Sprintf("%s/api/chats/%d/messages/%s", cons.base, chatID, "018f0000-0000-7000-8000-000000000000"), tok, `{"body": "x"}`, 404, "message_id"},
		{"PATCH", fmt.Sprintf("%s/api/chats/%d/messages/%s", work.base, chatID, m.ID), tok, `{"body": "x"}`, 404, "message_id"},
		{"PATCH", fmt.Sprintf("%s/api/chats/%d/messages/not-a-uuid", cons.base, chatID), tok, `{"body": "x"}`, 400, "message_id"},
		{"PATCH", u, tok, `{"body": ""}`, 400, "body"},
		{"PATCH", u, tok, `{"text": "x"}`, 400, "text"},
		{"PATCH", u, tok, `{"body": "x", "client_id": "k"}`, 400, "client_id"},
		{"PATCH", u, tok, `{"body": 5}`, 400, "body"},
		{"PATCH", u, tok, `[`, 400, ""},
	} {
		code, b := call(t, c.method, c.url, c.token, c.body)
		var e struct{ Error, Field string }
		if code != c.code || json.Unmarshal(b, &e) != nil || e.Field != c.field || e.Error == "" {
			t.Errorf("%s %s %s: %d %s, want %d naming %q", c.method, c.url, c.body, code, b, c.code, c.field)
		}
	}
	if n := h.Count(t, `SELECT count(*) FROM consumers.outbox WHERE event <> 'message.created' AND event <> 'receipt'`); n != 0 {
		t.Fatalf("rejected changes left %d outbox rows", n)
	}
	code, b := call(t, "PATCH", u, tok, `{"body": "second words"}`)
	if code != http.StatusOK || !bytes.Contains(b, []byte(`"version":2`)) || !bytes.Contains(b, []byte(`"edited_at":"`)) {
		t.Fatalf("edit: %d %s", code, b)
	}
	testenv.WaitFor(t, 20*time.Second, "the edit on workers", func() bool {
		return h.Count(t, `SELECT count(*) FROM workers.inbox WHERE message_id = $1 AND version = 2 AND body = 'second words'`, m.ID) == 1
	})
	type changeFrame struct {
		ID      string `json:"message_id"`
		Version int64  `json:"version"`
		Body    string `json:"body"`
		Deleted bool   `json:"deleted"`
	}
	// A room is pushed a changed message as it is at the push, so the
	// edit's frames are awaited before the delete can overtake them.
	for _, w := range []*chattest.Watcher{wc, ww} {
		testenv.WaitFor(t, 20*time.Second, "edit frames", func() bool { return len(w.Typed("edit")) >= 1 })
		var f changeFrame
		_ = json.Unmarshal(w.Typed("edit")[0], &f)
		if f.ID != m.ID || f.Version != 2 || f.Body != "second words" || f.Deleted {
			t.Fatalf("edit frame %s", w.Typed("edit")[0])
		}
	}
	code, b = call(t, "DELETE", u, tok, "")
	if code != http.StatusOK || !bytes.Contains(b, []byte(`"deleted":true`)) || !bytes.Contains(b, []byte(`"body":""`)) {
		t.Fatalf("delete: %d %s", code, b)
	}
	if code, b := call(t, "PATCH", u, tok, `{"body": "too late"}`); code != http.StatusConflict {
		t.Fatalf("edit after delete: %d %s", code, b)
	}
	testenv.WaitFor(t, 20*time.Second, "the delete on workers", func() bool {
		return h.Count(t, `SELECT count(*) FROM workers.inbox WHERE message_id = $1 AND version = 3 AND deleted AND body = ''`, m.ID) == 1
	})
	for _, w := range []*chattest.Watcher{wc, ww} {
		testenv.WaitFor(t, 20*time.Second, "delete frames", func() bool { return len(w.Typed("delete")) >= 1 })
		var f changeFrame
		_ = json.Unmarshal(w.Typed("delete")[0], &f)
		if f.ID != m.ID || f.Version != 3 || f.Body != "" || !f.Deleted {
			t.Fatalf("delete frame %s", w.Typed("delete")[0])
		}
	}
	for _, base := range []string{cons.base, work.base} {
		p := getLatest(t, fmt.Sprintf("%s/api/chats/%d/messages?last=5", base, chatID))
		if len(p.Messages) != 1 || !p.Messages[0].Deleted || p.Messages[0].Version != 3 || p.Messages[0].Body != "" || p.Messages[0].EditedAt == nil {
			t.Fatalf("%s history: %+v", base, p.Messages)
		}
	}
}

// xaddEvent adds an event named name to the stream from consumers to
// workers directly, as a relay (or a re-drive, or a duplicate) would.
func xaddEvent(t testing.TB, h *harness, name, id string, payload any) {
	t.Helper()
	b, err := json.Marshal(payload)
	if err != nil {
		t.Fatal(err)
	}
	keys := redisq.NewKeys(h.Prefix, chat.QueueName(chat.Consumers))
	err = testenv.Redis(t).XAdd(context.Background(), &redis.XAddArgs{Stream: keys.Stream,
		Values: []any{"id", id, "name", name, "payload", string(b)}}).Err()
	if err != nil {
		t.Fatal(err)
	}
}

// A message's changes delivered out of order, twice, before the message
// itself and again after its delete (as reclaims, re-drives and duplicate
// deliveries do): the edits that came first wait for the message, and the
// inbox ends at the latest version, deleted, with the socket's change
// frames in version order.
func TestChangesUnderReorderDuplicatesAndRedrive(t *testing.T) {
	h := newHarness(t, "")
	work := h.start(chat.Workers, nil)
	const chatID = 55
	w := chattest.Watch(t, work.base, chatID)
	msg := chat.Message{ID: uuid.Must(uuid.NewV7()).String(), ChatID: chatID, Seq: 1, Body: "v1", SentAt: time.Now(), From: chat.Consumers, Author: "tester"}
	change := func(v int64, body string, deleted bool) chat.Change {
		return chat.Change{ID: uuid.Must(uuid.NewV7()).String(), MessageID: msg.ID, ChatID: chatID, Seq: 1, Version: v, Body: body,
			EditedAt: time.Now(), Deleted: deleted, From: chat.Consumers, Author: "tester"}
	}
	c2, c3, c4 := change(2, "v2", false), change(3, "v3", false), change(4, "", true)
	send := func(c chat.Change) { xaddEvent(t, h, c.Event(), c.ID, c) }

	send(c3)
	send(c2)
	send(c3) // a duplicate of a held change
	testenv.WaitFor(t, 20*time.Second, "the early edits held", func() bool {
		return h.Count(t, `SELECT count(*) FROM workers.inbox_held_changes WHERE message_id = $1`, msg.ID) == 2
	})
	xaddEvent(t, h, chat.EventMessageCreated, msg.ID, msg)
	testenv.WaitFor(t, 20*time.Second, "the held edits applied", func() bool {
		return h.Count(t, `SELECT count(*) FROM workers.inbox WHERE message_id = $1 AND version = 3 AND body = 'v3'`, msg.ID) == 1 &&
			h.Count(t, `SELECT count(*) FROM workers.inbox_held_changes`) == 0
	})
	// barrier sends a message of another chat and waits for it: the one
	// worker takes the stream in order, so everything before it is applied.
	barriers := int64(0)
	barrier := func() {
		t.Helper()
		barriers++
		b := chat.Message{ID: uuid.Must(uuid.NewV7()).String(), ChatID: chatID + 1, Seq: barriers, Body: "barrier", SentAt: time.Now(), From: chat.Consumers}
		xaddEvent(t, h, chat.EventMessageCreated, b.ID, b)
		testenv.WaitFor(t, 20*time.Second, "the barrier", func() bool {
			return h.Count(t, `SELECT count(*) FROM workers.inbox WHERE message_id = $1`, b.ID) == 1
		})
	}
	send(c2) // late and old: nothing
	barrier()
	if n := h.Count(t, `SELECT count(*) FROM workers.inbox WHERE message_id = $1 AND version = 3 AND body = 'v3'`, msg.ID); n != 1 {
		t.Fatalf("a late older edit changed the message")
	}
	send(c4)
	send(c4)                                               // the delete twice
	xaddEvent(t, h, chat.EventMessageCreated, msg.ID, msg) // the message re-driven
	send(c3)                                               // an edit re-driven after the delete: nothing
	barrier()
	if n := h.Count(t, `SELECT count(*) FROM workers.inbox WHERE message_id = $1 AND version = 4 AND deleted AND body = ''`, msg.ID); n != 1 {
		t.Fatalf("the message is not at version 4, deleted, after the re-driven events")
	}
	// Every event is through (the stream's group has nothing pending) and
	// the row stays at version 4.
	testenv.WaitFor(t, 20*time.Second, "the stream drained", func() bool {
		keys := redisq.NewKeys(h.Prefix, chat.QueueName(chat.Consumers))
		p, err := testenv.Redis(t).XPending(context.Background(), keys.Stream, chat.Workers).Result()
		return err == nil && p.Count == 0 && len(w.Typed("delete")) >= 1
	})
	if n := h.Count(t, `SELECT count(*) FROM workers.inbox WHERE message_id = $1 AND version = 4 AND deleted`, msg.ID); n != 1 {
		t.Fatalf("final row not at version 4, deleted")
	}
	if n := h.Count(t, `SELECT count(*) FROM workers.inbox WHERE chat_id = $1`, chatID); n != 1 {
		t.Fatalf("inbox has %d rows of the chat", n)
	}
	// The socket: the message once, change frames with rising versions
	// ending at the delete.
	if ms := w.Messages(); len(ms) != 1 {
		t.Fatalf("socket got %d message frames", len(ms))
	}
	var versions []int64
	for _, typ := range []string{"edit", "delete"} {
		for _, b := range w.Typed(typ) {
			var f struct{ Version int64 }
			_ = json.Unmarshal(b, &f)
			versions = append(versions, f.Version)
		}
	}
	for i := 1; i < len(versions); i++ {
		if versions[i] <= versions[i-1] {
			t.Fatalf("change frames' versions not rising: %v", versions)
		}
	}
	if len(versions) == 0 || versions[len(versions)-1] != 4 {
		t.Fatalf("change frames' versions %v, want them to end at 4", versions)
	}
	// The message's row deleted on the receiver (retention, by hand): its
	// seq is below the chat's floor, so a change that comes now is dropped,
	// not held for a message that will not come again.
	if _, err := h.Admin.Exec(context.Background(), `DELETE FROM workers.inbox WHERE message_id = $1`, msg.ID); err != nil {
		t.Fatal(err)
	}
	send(change(5, "after the prune", false))
	barrier()
	if n := h.Count(t, `SELECT count(*) FROM workers.inbox_held_changes`); n != 0 {
		t.Fatalf("a change of a pruned message is held (%d rows)", n)
	}
}

// Read receipts: a reader's mark on workers travels back to consumers,
// whose messages up to it get read_at (history, a read frame live and one
// when a socket opens); unread counts follow.
func TestReadReceiptsReachTheSender(t *testing.T) {
	h, cons, work := startBoth(t)
	const chatID = 41
	wc := chattest.Watch(t, cons.base, chatID)
	ww := chattest.Watch(t, work.base, chatID)
	for i := 1; i <= 3; i++ {
		chattest.Send(t, cons.base, chatID, fmt.Sprint("note ", i))
	}
	ww.WaitSeqs(t, chat.Consumers, 3, 20*time.Second)
	readURL := fmt.Sprintf("%s/api/chats/%d/read", work.base, chatID)
	for body, field := range map[string]string{`{"upto_seq": -1}`: "upto_seq", `{"seq": 1}`: "seq", `{}`: "upto_seq", `nope`: ""} {
		code, b := call(t, "POST", readURL, chattest.Token(), body)
		var e struct{ Error, Field string }
		if code != http.StatusBadRequest || json.Unmarshal(b, &e) != nil || e.Field != field {
			t.Errorf("%s: %d %s, want 400 naming %q", body, code, b, field)
		}
	}
	code, b := call(t, "POST", readURL, chattest.Token(), `{"upto_seq": 2}`)
	if code != http.StatusOK || !bytes.Contains(b, []byte(`"upto_seq":2`)) || !bytes.Contains(b, []byte(`"unread":1`)) {
		t.Fatalf("read: %d %s", code, b)
	}
	testenv.WaitFor(t, 20*time.Second, "the read frame on consumers", func() bool {
		for _, f := range wc.Typed("read") {
			if bytes.Contains(f, []byte(`"upto_seq":2`)) && bytes.Contains(f, []byte(`"from":"consumers"`)) && bytes.Contains(f, []byte(`"read_at":"`)) {
				return true
			}
		}
		return false
	})
	p := getLatest(t, fmt.Sprintf("%s/api/chats/%d/messages?last=10", cons.base, chatID))
	if len(p.Messages) != 3 || p.Messages[0].ReadAt == nil || p.Messages[1].ReadAt == nil || p.Messages[2].ReadAt != nil {
		t.Fatalf("consumers history read_at: %+v", p.Messages)
	}
	// An older mark changes nothing; a later one moves on.
	if code, b := call(t, "POST", readURL, chattest.Token(), `{"upto_seq": 1}`); code != http.StatusOK || !bytes.Contains(b, []byte(`"upto_seq":2`)) {
		t.Fatalf("older mark: %d %s", code, b)
	}
	if n := h.Count(t, `SELECT count(*) FROM workers.outbox WHERE event = 'message.read'`) + h.Count(t, `SELECT count(*) FROM consumers.reads`); n < 1 {
		t.Fatalf("no read receipt went out")
	}
	call(t, "POST", readURL, chattest.Token(), `{"upto_seq": 3}`)
	testenv.WaitFor(t, 20*time.Second, "read up to 3 on consumers", func() bool {
		return h.Count(t, `SELECT coalesce(max(upto_seq), 0) FROM consumers.reads WHERE chat_id = $1`, chatID) == 3
	})
	// A new socket learns the watermark at once.
	nw := chattest.Watch(t, cons.base, chatID)
	testenv.WaitFor(t, 20*time.Second, "the read frame at open", func() bool {
		fs := nw.Typed("read")
		return len(fs) > 0 && bytes.Contains(fs[0], []byte(`"upto_seq":3`))
	})
	if ms := nw.Messages(); len(ms) > 0 && ms[len(ms)-1].ReadAt == nil {
		testenv.WaitFor(t, 20*time.Second, "catch-up frames", func() bool { return len(nw.Messages()) == 3 })
	}
	for _, m := range nw.Messages() {
		if m.ReadAt == nil {
			t.Fatalf("catch-up frame without read_at: %+v", m)
		}
	}
}

// liveClient is a WebSocket client of one user that records typing and
// presence frames.
type liveClient struct {
	c      *websocket.Conn
	frames chan []byte
}

func dialLive(t *testing.T, base string, chatID int64, user string) *liveClient {
	t.Helper()
	c := dialRaw(t, fmt.Sprintf("%s/ws?chat_id=%d&last=0", base, chatID), tokenOf(t, user))
	lc := &liveClient{c: c, frames: make(chan []byte, 256)}
	go func() {
		for {
			_, b, err := c.Read(context.Background())
			if err != nil {
				close(lc.frames)
				return
			}
			lc.frames <- b
		}
	}()
	return lc
}

// next returns the next frame of type typ within d (nil when none came).
func (l *liveClient) next(typ string, d time.Duration) []byte {
	deadline := time.After(d)
	for {
		select {
		case b, ok := <-l.frames:
			if !ok {
				return nil
			}
			var f struct{ Type string }
			if json.Unmarshal(b, &f) == nil && f.Type == typ {
				return b
			}
		case <-deadline:
			return nil
		}
	}
}

// presenceUntil reads presence frames until one lists exactly want (sorted
// "from:author" items) or d passes.
func (l *liveClient) presenceUntil(t *testing.T, d time.Duration, want ...string) {
	t.Helper()
	end := time.Now().Add(d)
	var last []byte
	for time.Now().Before(end) {
		b := l.next("presence", time.Until(end))
		if b == nil {
			break
		}
		last = b
		var f struct {
			Online []struct{ From, Author string }
		}
		_ = json.Unmarshal(b, &f)
		var got []string
		for _, p := range f.Online {
			got = append(got, p.From+":"+p.Author)
		}
		if strings.Join(got, ",") == strings.Join(want, ",") {
			return
		}
	}
	t.Fatalf("no presence frame listing %v within %v; last %s", want, d, last)
}

// Typing and presence across both services: a typing frame reaches every
// other client of the chat within 1 s (not its sender), over the rate it
// is dropped, presence follows opens and closes, and nothing of it is
// stored.
func TestTypingAndPresenceAcrossServices(t *testing.T) {
	h, cons, work := startBoth(t)
	const chatID = 61
	alice := dialLive(t, cons.base, chatID, "alice")
	bob := dialLive(t, work.base, chatID, "bob")
	carol := dialLive(t, cons.base, chatID, "carol")
	want := []string{"consumers:alice", "consumers:carol", "workers:bob"}
	bob.presenceUntil(t, 5*time.Second, want...)
	alice.presenceUntil(t, 5*time.Second, want...)
	carol.presenceUntil(t, 5*time.Second, want...)

	start := time.Now()
	if err := alice.c.Write(context.Background(), websocket.MessageText, []byte(`{"type":"typing"}`)); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]*liveClient{"bob": bob, "carol": carol} {
		b := c.next("typing", time.Second-time.Since(start))
		var f struct {
			ChatID       int64 `json:"chat_id"`
			From, Author string
		}
		if b == nil || json.Unmarshal(b, &f) != nil || f.ChatID != chatID || f.From != chat.Consumers || f.Author != "alice" {
			t.Fatalf("%s: typing frame %s within 1 s", name, b)
		}
	}
	if b := alice.next("typing", 300*time.Millisecond); b != nil {
		t.Fatalf("alice got her own typing frame: %s", b)
	}
	// A burst of 20: at most the limiter's burst (3) plus what refills.
	for range 20 {
		_ = bob.c.Write(context.Background(), websocket.MessageText, []byte(`{"type":"typing"}`))
	}
	got := 0
	for alice.next("typing", 500*time.Millisecond) != nil {
		got++
	}
	if got == 0 || got > 5 {
		t.Fatalf("alice got %d of bob's 20 typing frames, want 1..5", got)
	}
	// Carol closes: the others see her gone.
	carol.c.Close(websocket.StatusNormalClosure, "")
	bob.presenceUntil(t, 5*time.Second, "consumers:alice", "workers:bob")
	alice.presenceUntil(t, 5*time.Second, "consumers:alice", "workers:bob")
	if n := h.Count(t, `SELECT (SELECT count(*) FROM consumers.outbox WHERE event NOT IN ('message.created', 'receipt'))
		+ (SELECT count(*) FROM workers.outbox WHERE event NOT IN ('message.created', 'receipt'))
		+ (SELECT count(*) FROM consumers.messages) + (SELECT count(*) FROM workers.messages)`); n != 0 {
		t.Fatalf("typing or presence left %d rows", n)
	}
}
