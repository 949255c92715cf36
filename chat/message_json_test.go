package chat

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// MarshalJSON writes the object itself; it must stay what encoding/json
// made of the fields: every byte value and awkward rune in every string
// field, times in and out of UTC, nil and set optional fields, versions
// below 1.
func TestMessageMarshalJSONMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 2, 18, 0, 0, 123456789, time.FixedZone("X", 5*3600+1800))
	later := at.Add(1500 * time.Millisecond).UTC()
	base := Message{ID: "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", ChatID: 42, Seq: 7, Body: "hi", SentAt: at, From: Consumers}
	var samples []string
	for c := range 256 {
		samples = append(samples, "a"+string([]byte{byte(c)})+"z", string([]byte{byte(c)}))
	}
	samples = append(samples, "", "<script>&amp;</script>", "\u2028\u2029", "é日本語🙂", "\xed\xa0\x80", "a\xffb", "\x00",
		`"quoted" \back\slash`, "tab\tnew\nline\rcr", "\x7f", strings.Repeat("x", 5000))
	for _, s := range samples {
		for _, field := range []func(*Message){
			func(m *Message) { m.Body = s },
			func(m *Message) { m.ID = s },
			func(m *Message) { m.From = s },
			func(m *Message) { m.Author = s },
		} {
			m := base
			field(&m)
			checkMessageJSON(t, m)
		}
	}
	for _, m := range []Message{
		{},
		{ReceivedAt: &later, DeliveredAt: &later},
		{EditedAt: &later, ReadAt: &later, Deleted: true, Version: 3},
		{ChatID: -1, Seq: -9223372036854775808, Version: -5},
		{ChatID: 9223372036854775807, Seq: 1, Version: 9223372036854775807},
		{SentAt: time.Date(12345, 1, 1, 0, 0, 0, 0, time.UTC)},
		{SentAt: time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC)},
	} {
		m.ID, m.Body, m.From = base.ID, base.Body, base.From
		checkMessageJSON(t, m)
	}
	// Random strings of mixed ASCII, multi-byte runes and stray bytes.
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "Z", "0", " ", "\"", "\\", "<", ">", "&", "\n", "\x01", "\x7f", "é", "日", "🙂", "\u2028", "\xff", "\xe2\x80"}
	for range 2000 {
		var sb strings.Builder
		for range r.IntN(20) {
			sb.WriteString(alphabet[r.IntN(len(alphabet))])
		}
		m := base
		m.Body, m.Author = sb.String(), sb.String()
		checkMessageJSON(t, m)
	}
}

// FuzzMessageMarshalJSON checks MarshalJSON against encoding/json's
// encoding of the fields for any body and author.
func FuzzMessageMarshalJSON(f *testing.F) {
	f.Add("hello", "alice", int64(1))
	f.Add("<&>\u2028", "\xff", int64(0))
	f.Fuzz(func(t *testing.T, body, author string, version int64) {
		at := time.Date(2026, 12, 2, 18, 0, 0, 123456789, time.UTC)
		m := Message{ID: "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", ChatID: 1, Seq: 1, Body: body, Author: author,
			SentAt: at, From: Workers, Version: version, ReceivedAt: &at, DeliveredAt: &at}
		checkMessageJSON(t, m)
		if utf8.ValidString(body) {
			var back Message
			if err := json.Unmarshal(must(m.MarshalJSON()), &back); err != nil {
				t.Fatal(err)
			}
		}
	})
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}
