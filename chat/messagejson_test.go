package chat

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"
)

// refMarshalJSON and refEventJSON are MarshalJSON and EventJSON as they
// were written with encoding/json: the append encoders must give the same
// bytes.
func refMarshalJSON(m Message) ([]byte, error) {
	type wire struct {
		ID          string  `json:"id"`
		ChatID      int64   `json:"chat_id"`
		Seq         int64   `json:"seq"`
		Body        string  `json:"body"`
		SentAt      string  `json:"sent_at"`
		From        string  `json:"from"`
		Author      string  `json:"author,omitempty"`
		ReceivedAt  string  `json:"received_at,omitempty"`
		DeliveredAt *string `json:"delivered_at"`
		Version     int64   `json:"version"`
		EditedAt    *string `json:"edited_at,omitempty"`
		Deleted     bool    `json:"deleted"`
		ReadAt      *string `json:"read_at"`
	}
	w := wire{ID: m.ID, ChatID: m.ChatID, Seq: m.Seq, Body: m.Body, SentAt: formatTime(m.SentAt), From: m.From, Author: m.Author,
		Version: max(m.Version, 1), Deleted: m.Deleted, EditedAt: optTime(m.EditedAt), ReadAt: optTime(m.ReadAt)}
	if m.ReceivedAt != nil {
		w.ReceivedAt = formatTime(*m.ReceivedAt)
	}
	w.DeliveredAt = optTime(m.DeliveredAt)
	return json.Marshal(w)
}

func refEventJSON(m Message) ([]byte, error) {
	type wire struct {
		ID          string  `json:"id"`
		ChatID      int64   `json:"chat_id"`
		Seq         int64   `json:"seq"`
		Body        string  `json:"body"`
		SentAt      string  `json:"sent_at"`
		From        string  `json:"from"`
		Author      string  `json:"author,omitempty"`
		DeliveredAt *string `json:"delivered_at"`
	}
	return json.Marshal(wire{ID: m.ID, ChatID: m.ChatID, Seq: m.Seq, Body: m.Body, SentAt: formatTime(m.SentAt), From: m.From, Author: m.Author,
		DeliveredAt: optTime(m.DeliveredAt)})
}

// checkMessageJSON fails t unless MarshalJSON, EventJSON and an Encoder
// give the reference bytes for m.
func checkMessageJSON(t *testing.T, m Message) {
	t.Helper()
	want, err := refMarshalJSON(m)
	if err != nil {
		t.Fatal(err)
	}
	got, err := m.MarshalJSON()
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("MarshalJSON(%#v)\n got %s, %v\nwant %s", m, got, err, want)
	}
	var enc bytes.Buffer
	if err := json.NewEncoder(&enc).Encode(m); err != nil || enc.String() != string(want)+"\n" {
		t.Fatalf("Encoder.Encode(%#v)\n got %q, %v\nwant %q", m, enc.String(), err, string(want)+"\n")
	}
	want, err = refEventJSON(m)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := m.EventJSON(); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("EventJSON(%#v)\n got %s, %v\nwant %s", m, got, err, want)
	}
}

func TestMessageJSONMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 3, 4, 5, 6, 7, 891234567, time.FixedZone("x", 3600))
	later := at.Add(time.Minute)
	for _, m := range []Message{
		{},
		{ID: "0193e8a0-0000-7000-8000-000000000001", ChatID: 1, Seq: 1, Body: "hi", SentAt: at, From: Consumers},
		{ID: "x", ChatID: -5, Seq: 1 << 62, Body: "<a href=\"x\">&amp;</a>\\\b\f\n\r\t\x00\x01\x1f\x7f", SentAt: at, From: Workers,
			Author: "ü\u2028\u2029😀", ReceivedAt: &later, DeliveredAt: &later, Version: 3, EditedAt: &later, Deleted: true, ReadAt: &at},
		{Body: "bad \xff utf8 \xe2\x82 cut \xed\xa0\x80 surrogate", Author: "\xc3", Version: -2, DeliveredAt: &at},
		{Body: "ends in a cut rune \xe2\x82", SentAt: time.Date(12345, 1, 1, 0, 0, 0, 0, time.UTC)},
		{SentAt: time.Date(-3, 1, 1, 0, 0, 0, 0, time.UTC), EditedAt: &at},
		{SentAt: time.Date(0, 1, 1, 0, 0, 0, 999, time.UTC), ReadAt: &later},
		{SentAt: time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)},
		{SentAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.FixedZone("y", 7200))}, // 9999 in UTC
		{SentAt: time.Date(2026, 12, 31, 23, 30, 0, 1000, time.FixedZone("z", -3600))},
	} {
		checkMessageJSON(t, m)
	}
}

func FuzzMessageJSON(f *testing.F) {
	f.Add("0193e8a0", int64(1), int64(2), "hello <world> & \u2028", "consumers", "alice", int64(1), int64(1700000000123456789), uint8(0))
	f.Add("", int64(-1), int64(0), "\xff\x00\"\\", "", "", int64(-3), int64(-62135596800000000), uint8(31))
	f.Fuzz(func(t *testing.T, id string, chatID, seq int64, body, from, author string, version, nanos int64, opts uint8) {
		at := time.Unix(0, nanos)
		m := Message{ID: id, ChatID: chatID, Seq: seq, Body: body, SentAt: at, From: from, Author: author, Version: version,
			Deleted: opts&16 != 0}
		if opts&1 != 0 {
			m.ReceivedAt = &at
		}
		if opts&2 != 0 {
			m.DeliveredAt = &at
		}
		if opts&4 != 0 {
			m.EditedAt = &at
		}
		if opts&8 != 0 {
			m.ReadAt = &at
		}
		checkMessageJSON(t, m)
	})
}

// benchMessage is a typical sent message as the 201 answer shows it.
func benchMessage() Message {
	return Message{ID: "0193e8a0-7c1d-7b6e-9f00-1234567890ab", ChatID: 42, Seq: 1234, Body: "a message of some forty bytes, <b>bold</b>",
		SentAt: time.Date(2026, 3, 4, 5, 6, 7, 891234000, time.UTC), From: Consumers, Author: "user-17"}
}

func BenchmarkMessageMarshalJSON(b *testing.B) {
	m := benchMessage()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := json.Marshal(m); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMessageEventJSON(b *testing.B) {
	m := benchMessage()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := m.EventJSON(); err != nil {
			b.Fatal(err)
		}
	}
}
