package store

import (
	"encoding/json"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/outbox"
)

// refChatSeq is what the fence read before its fast path: json.Unmarshal.
func refChatSeq(p []byte) (chatID, seq int64, err error) {
	var ev struct {
		ChatID int64 `json:"chat_id"`
		Seq    int64 `json:"seq"`
	}
	err = json.Unmarshal(p, &ev)
	return ev.ChatID, ev.Seq, err
}

// checkChatSeq fails t when scanChatSeq answers p (ok) otherwise than
// json.Unmarshal, or when highWaterMarks of one message of p differs from
// the marks json.Unmarshal gives.
func checkChatSeq(t *testing.T, p []byte) {
	t.Helper()
	c, s, err := refChatSeq(p)
	if gc, gs, ok := scanChatSeq(p); ok && (err != nil || gc != c || gs != s) {
		t.Fatalf("scanChatSeq(%q) = %d, %d, ok; json.Unmarshal: %d, %d, %v", p, gc, gs, c, s, err)
	}
	var want map[int64]int64
	if err == nil && c > 0 {
		want = map[int64]int64{c: s}
	}
	got := highWaterMarks([]outbox.Message{{Event: chat.EventMessageCreated, Payload: p}})
	if !maps.Equal(got, want) {
		t.Fatalf("highWaterMarks(%q) = %v, want %v", p, got, want)
	}
}

var chatSeqCases = []string{
	`{"id": "x", "seq": 7, "body": "b", "chat_id": 3, "delivered_at": null}`, `{"chat_id":3,"seq":7}`, `{}`, ` { } `, `{"seq":7}`,
	`{"chat_id":3,"seq":7,"chat_id":4}`, `{"chat_id":3,"seq":7,"seq":"8"}`, `{"CHAT_ID":3,"seq":7}`, `{"Seq":9,"chat_id":1}`,
	`{"chat\u005fid":3,"seq":7}`, "{\"\u017feq\":5,\"chat_id\":1}", `{"chat_id":null,"seq":1}`, `{"chat_id":1.0,"seq":1}`,
	`{"chat_id":1e2,"seq":1}`, `{"chat_id":-0,"seq":1}`, `{"chat_id":01,"seq":1}`, `{"chat_id":9223372036854775808,"seq":1}`,
	`{"chat_id":-9223372036854775808,"seq":1}`, `{"chat_id":"3","seq":1}`, `{"chat_id":3,"seq":1}x`, `{"chat_id":3,"seq":1`,
	`{"chat_id":3,"seq":1,}`, `{"chat_id":3 "seq":1}`, `[{"chat_id":3}]`, `null`, ``, `{"a":[1,{"b":[true,false,null]},"s\"\\\/\b\f\n\r\t\u00e9"],"chat_id":2,"seq":3}`,
	`{"a":"\x","chat_id":2,"seq":3}`, `{"a":"\u12G4","chat_id":2,"seq":3}`, "{\"a\":\"tab\there\",\"chat_id\":2,\"seq\":3}",
	"{\"a\":\"\xff\xfe\",\"chat_id\":2,\"seq\":3}", `{"a":-,"chat_id":2,"seq":3}`, `{"a":1.,"chat_id":2,"seq":3}`, `{"a":1.5e+3,"chat_id":2,"seq":3}`,
	`{"a":tru,"chat_id":2,"seq":3}`, `{"a":{"chat_id":9},"chat_id":2,"seq":3}`, `{"a":` + strings.Repeat("[", 200) + strings.Repeat("]", 200) + `,"chat_id":2,"seq":3}`,
	`{"chat_id":2,"seq":3}` + "\n", `{"chat_id" : 2 , "seq" : 3 }`, `{"chat_id":-4,"seq":3}`,
}

func TestScanChatSeqMatchesUnmarshal(t *testing.T) {
	t.Parallel()
	for _, c := range chatSeqCases {
		checkChatSeq(t, []byte(c))
	}
}

// TestScanChatSeqTakesTheSendPathsPayloads: the payloads the send path
// writes, as the relay reads them back (jsonb's text) and as written, take
// the fast path.
func TestScanChatSeqTakesTheSendPathsPayloads(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)
	m := chat.Message{ID: "0193e8a0-7c1d-7b6e-9f00-1234567890ab", ChatID: 42, Seq: 7, Body: "héllo \"<x>\"\n", SentAt: at,
		From: chat.Consumers, Author: "ü"}
	ev, err := m.EventJSON()
	if err != nil {
		t.Fatal(err)
	}
	full, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		p          []byte
		chat, seqs int64
	}{{ev, 42, 7}, {full, 42, 7}, {benchRelayBatch(1)[0].Payload, 1, 1000}} {
		c, s, ok := scanChatSeq(tc.p)
		if !ok || c != tc.chat || s != tc.seqs {
			t.Fatalf("scanChatSeq(%s) = %d, %d, %v; want %d, %d, ok", tc.p, c, s, ok, tc.chat, tc.seqs)
		}
		checkChatSeq(t, tc.p)
	}
}

func FuzzScanChatSeq(f *testing.F) {
	for _, c := range chatSeqCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, p []byte) { checkChatSeq(t, p) })
}
