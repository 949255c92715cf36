package chat

import (
	"strconv"
	"time"
	"unicode/utf8"
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
		dst = appendJSONTime(dst, *m.ReceivedAt)
	}
	dst = append(dst, `,"delivered_at":`...)
	dst = appendOptTime(dst, m.DeliveredAt)
	dst = append(dst, `,"version":`...)
	dst = strconv.AppendInt(dst, max(m.Version, 1), 10)
	if m.EditedAt != nil {
		dst = append(dst, `,"edited_at":`...)
		dst = appendJSONTime(dst, *m.EditedAt)
	}
	dst = append(dst, `,"deleted":`...)
	dst = strconv.AppendBool(dst, m.Deleted)
	dst = append(dst, `,"read_at":`...)
	dst = appendOptTime(dst, m.ReadAt)
	return append(dst, '}')
}

// appendEventJSON appends EventJSON's bytes to dst.
func (m Message) appendEventJSON(dst []byte) []byte {
	dst = m.appendHead(dst)
	dst = append(dst, `,"delivered_at":`...)
	dst = appendOptTime(dst, m.DeliveredAt)
	return append(dst, '}')
}

// appendHead appends the fields both encodings start with: "{" then id,
// chat_id, seq, body, sent_at, from and author (when not empty).
func (m Message) appendHead(dst []byte) []byte {
	dst = append(dst, `{"id":`...)
	dst = appendJSONString(dst, m.ID)
	dst = append(dst, `,"chat_id":`...)
	dst = strconv.AppendInt(dst, m.ChatID, 10)
	dst = append(dst, `,"seq":`...)
	dst = strconv.AppendInt(dst, m.Seq, 10)
	dst = append(dst, `,"body":`...)
	dst = appendJSONString(dst, m.Body)
	dst = append(dst, `,"sent_at":`...)
	dst = appendJSONTime(dst, m.SentAt)
	dst = append(dst, `,"from":`...)
	dst = appendJSONString(dst, m.From)
	if m.Author != "" {
		dst = append(dst, `,"author":`...)
		dst = appendJSONString(dst, m.Author)
	}
	return dst
}

// jsonSize is a first guess of m's encoded size, so that one allocation
// usually holds it.
func (m Message) jsonSize() int {
	return 256 + len(m.Body) + len(m.Author) + len(m.ID)
}

// appendOptTime appends t as a JSON string, or null for a nil t.
func appendOptTime(dst []byte, t *time.Time) []byte {
	if t == nil {
		return append(dst, "null"...)
	}
	return appendJSONTime(dst, *t)
}

// appendJSONTime appends formatTime(t) as a JSON string. Years 0 to 9999
// are written digit by digit (time's layout interpreter was a visible part
// of a message's encoding); others through AppendFormat.
func appendJSONTime(dst []byte, t time.Time) []byte {
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		var buf [48]byte
		return appendJSONString(dst, t.AppendFormat(buf[:0], timeLayout))
	}
	hour, minute, sec := t.Clock()
	dst = append(dst, '"')
	dst = appendDigits(dst, year, 4)
	dst = append(dst, '-')
	dst = appendDigits(dst, int(month), 2)
	dst = append(dst, '-')
	dst = appendDigits(dst, day, 2)
	dst = append(dst, 'T')
	dst = appendDigits(dst, hour, 2)
	dst = append(dst, ':')
	dst = appendDigits(dst, minute, 2)
	dst = append(dst, ':')
	dst = appendDigits(dst, sec, 2)
	dst = append(dst, '.')
	dst = appendDigits(dst, t.Nanosecond()/1000, 6) // truncated, as Format does
	return append(dst, 'Z', '"')
}

// appendDigits appends n (0 ≤ n < 10^width) as width decimal digits.
func appendDigits(dst []byte, n, width int) []byte {
	var buf [8]byte
	for i := width - 1; i >= 0; i-- {
		buf[i] = byte('0' + n%10)
		n /= 10
	}
	return append(dst, buf[:width]...)
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as encoding/json encodes a string (with its
// default HTML escaping): ", \ and control characters escaped, <, > and &
// as \u003c, \u003e and \u0026, U+2028 and U+2029 as \u2028 and \u2029,
// each invalid UTF-8 byte as \ufffd.
func appendJSONString[S []byte | string](dst []byte, s S) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xF])
			}
			i++
			start = i
			continue
		}
		n := min(len(s)-i, utf8.UTFMax)
		c, size := utf8.DecodeRuneInString(string(s[i : i+n]))
		if c == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if c == '\u2028' || c == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[c&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
