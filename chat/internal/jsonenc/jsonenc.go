// Package jsonenc appends JSON values to a byte slice with the bytes
// encoding/json gives for them, without reflection: the chat's hot
// encoders (a message's payload and answer, the WebSocket acks) build their
// documents field by field with it. Standard library only; every function
// is pure and safe for concurrent use.
package jsonenc

import (
	"time"
	"unicode/utf8"
)

// TimeLayout is how the chat writes a time: RFC 3339 in UTC with
// microseconds ("2006-01-02T15:04:05.000000Z").
const TimeLayout = "2006-01-02T15:04:05.000000Z07:00"

// AppendOptTime appends AppendTime of *t to dst, or null for a nil t, and
// returns the extended slice.
func AppendOptTime(dst []byte, t *time.Time) []byte {
	if t == nil {
		return append(dst, "null"...)
	}
	return AppendTime(dst, *t)
}

// AppendTime appends t in UTC, formatted with TimeLayout, as a JSON string
// to dst and returns the extended slice. Years 0 to 9999 are written digit
// by digit (time's layout interpreter was a visible part of a message's
// encoding); others through AppendFormat.
func AppendTime(dst []byte, t time.Time) []byte {
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		var buf [48]byte
		return AppendString(dst, t.AppendFormat(buf[:0], TimeLayout))
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

// AppendString appends s as encoding/json encodes a string (with its
// default HTML escaping) to dst and returns the extended slice: ", \ and
// control characters escaped, <, > and & as \u003c, \u003e and \u0026,
// U+2028 and U+2029 as \u2028 and \u2029, each invalid UTF-8 byte as
// \ufffd.
func AppendString[S []byte | string](dst []byte, s S) []byte {
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
