package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/auth"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/redisq"
)

// writeEventKeys writes an event key file with the given lines and
// returns its path.
func writeEventKeys(t *testing.T, lines ...string) string {
	t.Helper()
	return testenv.WriteFile(t, "event.keys", []byte(strings.Join(lines, "\n")+"\n"))
}

func hexKey(b byte) string { return strings.Repeat(fmt.Sprintf("%02x", b), 32) }

// TestForgedEntryDoesNotTakeSlot: someone who can write to Redis adds
// entries for chat 7 seq 1 before the real message 1 of chat 7 is sent, one
// unsigned and one signed with a key the services do not have. Both are
// dead-lettered with their reason before the inbox is touched, and the real
// message takes its slot and reaches the room.
func TestForgedEntryDoesNotTakeSlot(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	keysFile := writeEventKeys(t, "consumers-to-workers "+hexKey(1), "workers-to-consumers "+hexKey(2))
	withKeys := func(c *Config) { c.EventKeyFile = keysFile }
	work := h.start(chat.Workers, withKeys)
	w := chattest.Watch(t, work.base, 7)

	attacker, err := auth.ReadEventKeys(writeEventKeys(t, "consumers-to-workers "+hexKey(9), "workers-to-consumers "+hexKey(9)))
	if err != nil {
		t.Fatal(err)
	}
	rdb := testenv.Redis(t)
	keys := redisq.NewKeys(h.Prefix, chat.QueueName(chat.Consumers))
	forge := func(body string, signer *auth.EventKeys) {
		id := uuid.NewString()
		payload, _ := json.Marshal(chat.Message{ID: id, ChatID: 7, Seq: 1, Body: body, SentAt: time.Now(), From: chat.Consumers})
		addEntry(t, rdb, keys.Stream, chat.QueueName(chat.Consumers), redisq.Job{ID: id, Name: chat.EventMessageCreated, Payload: payload}, signer)
	}
	forge("forged, unsigned", nil)
	forge("forged, wrong key", attacker)
	waitForgedDeadLettered(t, rdb, keys.Dead)
	if n := h.Count(t, `SELECT count(*) FROM workers.inbox`); n != 0 {
		t.Fatalf("a forged entry reached the inbox (%d rows)", n)
	}

	cons := h.start(chat.Consumers, withKeys)
	m := chattest.Send(t, cons.base, 7, "the real one")
	got := w.WaitSeqs(t, chat.Consumers, 1, 20*time.Second)
	if got[0].ID != m.ID || got[0].Body != "the real one" {
		t.Fatalf("room shows %+v, want the real message %s", got[0], m.ID)
	}
	if n := h.Count(t, `SELECT count(*) FROM workers.inbox WHERE chat_id = 7 AND seq = 1 AND message_id = $1`, m.ID); n != 1 {
		t.Fatal("the real message does not hold its (chat, seq) slot")
	}
}

// TestEventKeys covers the key file and rotation: the first key of a
// direction signs, both verify; a key only the sender has is refused.
func TestEventKeys(t *testing.T) {
	t.Parallel()
	old, err := auth.ReadEventKeys(writeEventKeys(t, "consumers-to-workers "+hexKey(1), "workers-to-consumers "+hexKey(2)))
	if err != nil {
		t.Fatal(err)
	}
	rotating, err := auth.ReadEventKeys(writeEventKeys(t, "# new key first, old one still accepted",
		"consumers-to-workers "+hexKey(3), "consumers-to-workers "+hexKey(1), "", "workers-to-consumers "+hexKey(2)))
	if err != nil {
		t.Fatal(err)
	}
	rotated, err := auth.ReadEventKeys(writeEventKeys(t, "consumers-to-workers "+hexKey(3), "workers-to-consumers "+hexKey(2)))
	if err != nil {
		t.Fatal(err)
	}
	q := chat.QueueName(chat.Consumers)
	job := redisq.Job{ID: uuid.NewString(), Name: chat.EventMessageCreated, Payload: []byte(`{"x":1}`)}
	d := func(sig string) inbox.Delivery {
		return inbox.Delivery{ID: job.ID, Name: job.Name, Payload: job.Payload, Sig: sig}
	}
	oldSig, newSig := old.Signer(q)(job), rotating.Signer(q)(job)
	for _, tc := range []struct {
		name string
		keys *auth.EventKeys
		sig  string
		want error
	}{
		{"old key, old receiver", old, oldSig, nil},
		{"old key, rotating receiver", rotating, oldSig, nil},
		{"new key, rotating receiver", rotating, newSig, nil},
		{"new key, old receiver", old, newSig, auth.ErrForged},
		{"old key, rotated receiver", rotated, oldSig, auth.ErrForged},
		{"other direction's key", old, old.Signer(chat.QueueName(chat.Workers))(job), auth.ErrForged},
		{"no signature", old, "", auth.ErrUnsigned},
		{"garbage", old, "v1=zz", auth.ErrForged},
	} {
		if err := tc.keys.Verify(q, d(tc.sig)); !errors.Is(err, tc.want) && err != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	// The payload, name and id are all covered.
	changed := d(oldSig)
	changed.Payload = []byte(`{"x":2}`)
	if err := old.Verify(q, changed); !errors.Is(err, auth.ErrForged) {
		t.Errorf("changed payload: %v, want ErrForged", err)
	}
	changed = d(oldSig)
	changed.ID = uuid.NewString()
	if err := old.Verify(q, changed); !errors.Is(err, auth.ErrForged) {
		t.Errorf("changed id: %v, want ErrForged", err)
	}
	for _, bad := range [][]string{
		{"consumers-to-workers " + hexKey(1)},                              // no key for the other direction
		{"consumers-to-workers abcd", "workers-to-consumers " + hexKey(2)}, // short
		{"sideways " + hexKey(1), "workers-to-consumers " + hexKey(2)},     // direction
		{"consumers-to-workers " + hexKey(1), "consumers-to-workers " + hexKey(2), "consumers-to-workers " + hexKey(3), "workers-to-consumers " + hexKey(2)}, // three keys
	} {
		if _, err := auth.ReadEventKeys(writeEventKeys(t, bad...)); err == nil {
			t.Errorf("key file %q accepted", bad)
		}
	}
}

// TestForgedReceiptIsRefused: someone who can write to Redis adds receipts
// "workers stored chat 9 up to seq 3" to the stream the consumers read
// receipts from, one unsigned and one signed with a key the services do not
// have, while the workers are down. Both are dead-lettered; the messages
// stay undelivered and the Redriver keeps publishing them again. The same
// receipt signed with the workers' key (the control) marks them delivered.
func TestForgedReceiptIsRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	keysFile := writeEventKeys(t, "consumers-to-workers "+hexKey(3), "workers-to-consumers "+hexKey(4))
	cons := h.start(chat.Consumers, func(c *Config) { c.EventKeyFile = keysFile; c.Relay.RedriveAfter = 500 * time.Millisecond })
	for i := 1; i <= 3; i++ {
		chattest.Send(t, cons.base, 9, fmt.Sprint("m", i))
	}
	redrives := func() int {
		return h.Count(t, `SELECT coalesce(sum(redrives), 0) FROM consumers.messages WHERE chat_id = 9`)
	}
	testenv.WaitFor(t, 20*time.Second, "the messages re-driven (no receipt: the workers are down)", func() bool { return redrives() >= 3 })

	attacker, err := auth.ReadEventKeys(writeEventKeys(t, "consumers-to-workers "+hexKey(9), "workers-to-consumers "+hexKey(9)))
	if err != nil {
		t.Fatal(err)
	}
	real, err := auth.ReadEventKeys(keysFile)
	if err != nil {
		t.Fatal(err)
	}
	rdb := testenv.Redis(t)
	keys := redisq.NewKeys(h.Prefix, chat.QueueName(chat.Workers))
	receipt := func(signer *auth.EventKeys) {
		id := uuid.NewString()
		payload, _ := json.Marshal(chat.Receipt{ID: id, Chats: []chat.ReceiptChat{{ChatID: 9, UptoSeq: 3}}, ReceivedAt: time.Now(), From: chat.Workers})
		addEntry(t, rdb, keys.Stream, chat.QueueName(chat.Workers), redisq.Job{ID: id, Name: chat.EventReceipt, Payload: payload}, signer)
	}
	receipt(nil)
	receipt(attacker)
	waitForgedDeadLettered(t, rdb, keys.Dead)
	if n := h.Count(t, `SELECT count(*) FROM consumers.messages_with_receipts WHERE chat_id = 9 AND delivered_at IS NOT NULL`); n != 0 {
		t.Fatalf("a forged receipt marked %d messages delivered", n)
	}
	// The re-drive goes on after the forged receipts were refused.
	before := redrives()
	testenv.WaitFor(t, 30*time.Second, "the messages re-driven again after the forged receipts", func() bool { return redrives() >= before+3 })
	if n := h.Count(t, `SELECT count(*) FROM consumers.messages_with_receipts WHERE chat_id = 9 AND delivered_at IS NOT NULL`); n != 0 {
		t.Fatalf("%d messages marked delivered without a genuine receipt", n)
	}

	// Control: the same receipt signed with the workers' key is applied.
	receipt(real)
	testenv.WaitFor(t, 20*time.Second, "the genuine receipt marks the messages delivered", func() bool {
		return h.Count(t, `SELECT count(*) FROM consumers.messages_with_receipts WHERE chat_id = 9 AND delivered_at IS NOT NULL`) == 3
	})
	if n, _ := rdb.XLen(context.Background(), keys.Dead).Result(); n != 2 {
		t.Fatalf("dead letters %d, want the 2 forged receipts only", n)
	}
}

// addEntry adds j to stream as the relay would, signed for queue with
// signer's key (no signature when signer is nil), bypassing the dedupe key.
func addEntry(t *testing.T, rdb *redis.Client, stream, queue string, j redisq.Job, signer *auth.EventKeys) {
	t.Helper()
	args := &redis.XAddArgs{Stream: stream, Values: []any{"id", j.ID, "name", j.Name, "payload", string(j.Payload)}}
	if signer != nil {
		args.Values = append(args.Values.([]any), "sig", signer.Signer(queue)(j))
	}
	if err := rdb.XAdd(context.Background(), args).Err(); err != nil {
		t.Fatal(err)
	}
}

// waitForgedDeadLettered waits for two dead letters in dead, one unsigned
// and one forged (signed with a key the services do not have).
func waitForgedDeadLettered(t *testing.T, rdb *redis.Client, dead string) {
	t.Helper()
	var ds []redis.XMessage
	testenv.WaitFor(t, 20*time.Second, "both forged entries dead-lettered", func() bool {
		ds, _ = rdb.XRange(context.Background(), dead, "-", "+").Result()
		return len(ds) == 2
	})
	reasons := fmt.Sprint(ds[0].Values["reason"], " | ", ds[1].Values["reason"])
	if !strings.Contains(reasons, auth.ErrUnsigned.Error()) || !strings.Contains(reasons, auth.ErrForged.Error()) {
		t.Fatalf("dead-letter reasons %q: want one unsigned, one forged", reasons)
	}
}
