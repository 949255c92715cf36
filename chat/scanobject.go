package chat

import "github.com/outboxchat/outboxchat/chat/internal/jsonscan"

// objectScan walks the members of one JSON object that is the whole of its
// input (spaces aside), for the fast paths of the decoders: each next
// positions S at a member's value, with key its key (keyValid: the key's
// bytes are valid UTF-8); the caller consumes the value with S and calls
// next again. A key with escapes, or any syntax error, ends the walk as a
// failure: the slow paths (json.Unmarshal) decode those. The zero value is
// not ready: set S.P to the input.
type objectScan struct {
	S        jsonscan.Scanner
	key      []byte
	keyValid bool
	state    uint8
}

// The states of an objectScan.
const (
	objectStart   = iota // before '{'
	objectMembers        // after a member's value
	objectClosed         // after the closing '}'
	objectFailed
)

// next moves to the next member's value and reports whether there is one;
// false at the object's end (see done) or on a failure.
func (o *objectScan) next() bool {
	s := &o.S
	switch o.state {
	case objectStart:
		s.Space()
		if !s.Byte('{') {
			o.state = objectFailed
			return false
		}
		s.Space()
		if s.Byte('}') {
			o.state = objectClosed
			return false
		}
	case objectMembers:
		s.Space()
		if s.Byte('}') {
			o.state = objectClosed
			return false
		}
		if !s.Byte(',') {
			o.state = objectFailed
			return false
		}
		s.Space()
	default:
		return false
	}
	from, to, plain, valid := s.Str()
	if !plain {
		o.state = objectFailed
		return false
	}
	s.Space()
	if !s.Byte(':') {
		o.state = objectFailed
		return false
	}
	s.Space()
	o.key, o.keyValid, o.state = s.P[from:to], valid, objectMembers
	return true
}

// done reports whether the walk reached the object's closing '}' with
// nothing but spaces after it.
func (o *objectScan) done() bool {
	if o.state != objectClosed {
		return false
	}
	o.S.Space()
	return o.S.I == len(o.S.P)
}
