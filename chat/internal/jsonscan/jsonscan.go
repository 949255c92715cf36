// Package jsonscan reads JSON text strictly as encoding/json does, without
// reflection, and its Scanner allocates nothing: it serves the fast paths
// that decode the few shapes the services write themselves (an outbox
// payload's chat_id and seq, a message.created event) and leave anything
// else to encoding/json, whose answer they must equal. See Scanner.
package jsonscan

import (
	"strconv"
	"unicode/utf8"
)

// Scanner reads the JSON text P from index I on, strictly as encoding/json
// does (any bytes of 0x80 and above are allowed in strings; a caller that
// takes a string's bytes as its text checks them with utf8.Valid, since
// encoding/json replaces invalid UTF-8). Each method consumes what it
// recognises and advances I; on false, I is wherever the mismatch was and
// the text is not that shape. The zero Scanner with P set starts at the
// first byte. Not safe for concurrent use; it allocates nothing.
type Scanner struct {
	P []byte
	I int
}

// MaxDepth bounds the nesting Value follows (encoding/json's own limit is
// 10000): a deeper document makes Value return false, and the caller falls
// back to encoding/json.
const MaxDepth = 100

// Space skips JSON white space.
func (s *Scanner) Space() {
	for s.I < len(s.P) && (s.P[s.I] == ' ' || s.P[s.I] == '\t' || s.P[s.I] == '\n' || s.P[s.I] == '\r') {
		s.I++
	}
}

// Byte consumes c if it is next.
func (s *Scanner) Byte(c byte) bool {
	if s.I < len(s.P) && s.P[s.I] == c {
		s.I++
		return true
	}
	return false
}

// Str consumes a string and returns its text's bounds; valid is false
// when it is not a valid JSON string, plain is false too when it has an
// escape or a byte of 0x80 or above.
func (s *Scanner) Str() (from, to int, plain, valid bool) {
	if !s.Byte('"') {
		return 0, 0, false, false
	}
	from, plain = s.I, true
	for s.I < len(s.P) {
		switch c := s.P[s.I]; {
		case c == '"':
			s.I++
			return from, s.I - 1, plain, true
		case c < 0x20:
			return 0, 0, false, false
		case c == '\\':
			plain = false
			if s.I+1 >= len(s.P) {
				return 0, 0, false, false
			}
			switch s.P[s.I+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.I += 2
			case 'u':
				if s.I+6 > len(s.P) {
					return 0, 0, false, false
				}
				for _, h := range s.P[s.I+2 : s.I+6] {
					if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
						return 0, 0, false, false
					}
				}
				s.I += 6
			default:
				return 0, 0, false, false
			}
		default:
			if c >= utf8.RuneSelf {
				plain = false
			}
			s.I++
		}
	}
	return 0, 0, false, false
}

// ValidStr consumes a valid string.
func (s *Scanner) ValidStr() bool {
	_, _, _, valid := s.Str()
	return valid
}

// digits consumes one or more decimal digits.
func (s *Scanner) digits() bool {
	from := s.I
	for s.I < len(s.P) && '0' <= s.P[s.I] && s.P[s.I] <= '9' {
		s.I++
	}
	return s.I > from
}

// Integer consumes a JSON number without fraction or exponent, and fails
// (for json.Unmarshal to judge) on any other number.
func (s *Scanner) Integer() bool {
	s.Byte('-')
	if s.Byte('0') {
		// A leading zero stands alone.
	} else if !s.digits() {
		return false
	}
	return s.I == len(s.P) || (s.P[s.I] != '.' && s.P[s.I] != 'e' && s.P[s.I] != 'E' && !('0' <= s.P[s.I] && s.P[s.I] <= '9'))
}

// Number consumes a JSON number.
func (s *Scanner) Number() bool {
	s.Byte('-')
	if !s.Byte('0') && !s.digits() {
		return false
	}
	if s.Byte('.') && !s.digits() {
		return false
	}
	if s.Byte('e') || s.Byte('E') {
		if !s.Byte('+') {
			s.Byte('-')
		}
		return s.digits()
	}
	return true
}

// literal consumes word.
func (s *Scanner) literal(word string) bool {
	if len(s.P)-s.I >= len(word) && string(s.P[s.I:s.I+len(word)]) == word {
		s.I += len(word)
		return true
	}
	return false
}

// Value consumes a valid JSON value nested depth levels deep.
func (s *Scanner) Value(depth int) bool {
	if s.I >= len(s.P) || depth > MaxDepth {
		return false
	}
	switch s.P[s.I] {
	case '"':
		return s.ValidStr()
	case '{':
		s.I++
		s.Space()
		if s.Byte('}') {
			return true
		}
		for {
			if !s.ValidStr() {
				return false
			}
			s.Space()
			if !s.Byte(':') {
				return false
			}
			s.Space()
			if !s.Value(depth + 1) {
				return false
			}
			s.Space()
			if s.Byte('}') {
				return true
			}
			if !s.Byte(',') {
				return false
			}
			s.Space()
		}
	case '[':
		s.I++
		s.Space()
		if s.Byte(']') {
			return true
		}
		for {
			if !s.Value(depth + 1) {
				return false
			}
			s.Space()
			if s.Byte(']') {
				return true
			}
			if !s.Byte(',') {
				return false
			}
			s.Space()
		}
	case 't':
		return s.literal("true")
	case 'f':
		return s.literal("false")
	case 'n':
		return s.literal("null")
	}
	return s.Number()
}

// Int64 consumes an integer (no fraction or exponent) that fits int64 and
// returns it; ok is false for any other value, which encoding/json would
// refuse for an int64 field or (a null) leave the field unchanged for.
func (s *Scanner) Int64() (n int64, ok bool) {
	from := s.I
	if !s.Integer() {
		return 0, false
	}
	n, err := strconv.ParseInt(string(s.P[from:s.I]), 10, 64)
	return n, err == nil
}

// Bool consumes true or false and returns it; ok is false for any other
// value.
func (s *Scanner) Bool() (v, ok bool) {
	switch {
	case s.literal("true"):
		return true, true
	case s.literal("false"):
		return false, true
	}
	return false, false
}
