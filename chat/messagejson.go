package chat

import (
	"strconv"

	"github.com/outboxchat/outboxchat/chat/internal/jsonenc"
)

// The send path encodes every message twice (its event payload and the
// 201 answer); encoding/json's reflection, and the re-scan an Encoder makes
// of a Marshaler's output, were a visible share of a send's CPU. These
// append the same bytes json.Marshal gave for the wire structs of
// MarshalJSON and EventJSON (messagejson_test.go checks that, fuzzed).

// AppendJSON appends m's JSON (exactly the bytes of MarshalJSON, compact,
// no newline) to dst and returns the extended slice. It never fails.
func (m Message) AppendJSON(dst []byte) []byte {
	dst = m.appendHead(dst)
	if m.ReceivedAt != nil {
		dst = append(dst, `,"received_at":`...)
		dst = jsonenc.AppendTime(dst, *m.ReceivedAt)
	}
	dst = append(dst, `,"delivered_at":`...)
	dst = jsonenc.AppendOptTime(dst, m.DeliveredAt)
	dst = append(dst, `,"version":`...)
	dst = strconv.AppendInt(dst, max(m.Version, 1), 10)
	if m.EditedAt != nil {
		dst = append(dst, `,"edited_at":`...)
		dst = jsonenc.AppendTime(dst, *m.EditedAt)
	}
	dst = append(dst, `,"deleted":`...)
	dst = strconv.AppendBool(dst, m.Deleted)
	dst = append(dst, `,"read_at":`...)
	dst = jsonenc.AppendOptTime(dst, m.ReadAt)
	return append(dst, '}')
}

// appendEventJSON appends EventJSON's bytes to dst.
func (m Message) appendEventJSON(dst []byte) []byte {
	dst = m.appendHead(dst)
	dst = append(dst, `,"delivered_at":`...)
	dst = jsonenc.AppendOptTime(dst, m.DeliveredAt)
	return append(dst, '}')
}

// appendHead appends the fields both encodings start with: "{" then id,
// chat_id, seq, body, sent_at, from and author (when not empty).
func (m Message) appendHead(dst []byte) []byte {
	dst = append(dst, `{"id":`...)
	dst = jsonenc.AppendString(dst, m.ID)
	dst = append(dst, `,"chat_id":`...)
	dst = strconv.AppendInt(dst, m.ChatID, 10)
	dst = append(dst, `,"seq":`...)
	dst = strconv.AppendInt(dst, m.Seq, 10)
	dst = append(dst, `,"body":`...)
	dst = jsonenc.AppendString(dst, m.Body)
	dst = append(dst, `,"sent_at":`...)
	dst = jsonenc.AppendTime(dst, m.SentAt)
	dst = append(dst, `,"from":`...)
	dst = jsonenc.AppendString(dst, m.From)
	if m.Author != "" {
		dst = append(dst, `,"author":`...)
		dst = jsonenc.AppendString(dst, m.Author)
	}
	return dst
}

// jsonSize is a first guess of m's encoded size, so that one allocation
// usually holds it.
func (m Message) jsonSize() int {
	return 256 + len(m.Body) + len(m.Author) + len(m.ID)
}
