package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/outboxchat/outboxchat/chat/internal/jsonenc"
	"github.com/outboxchat/outboxchat/chat/internal/jsonscan"
)

// EventMessageCreated is the outbox event name of a sent message.
const EventMessageCreated = "message.created"

// DefaultMaxBodyBytes is the default limit on a message body, in bytes of UTF-8.
const DefaultMaxBodyBytes = 4096

// Message is a chat message as the API, the WebSocket and the event payload
// show it (JSON, snake_case). It is also the outbox event payload: unknown
// fields are ignored on decode, so the format can grow.
//
//   - ID: the message id, a UUID chosen by the sending service (version 7,
//     time-ordered); it is the queue's idempotency key and the receiver's
//     inbox key.
//   - ChatID: positive 64-bit chat id.
//   - Seq: the sender's per-chat sequence number: 1, 2, 3 … with no gaps.
//   - Body: the text, valid UTF-8 without NUL, 1..max bytes.
//   - SentAt: the sending service's clock when its committer numbered the
//     message's send batch (RFC 3339, microseconds, UTC).
//   - From: the sending service (Consumers or Workers).
//   - Author: who wrote it, the sender's authenticated user (the token's
//     sub claim); omitted when the sender runs without auth.
//   - ReceivedAt: set only on messages this service received (inbox rows):
//     when its inbox stored it.
//   - DeliveredAt: when the receiving side stored the message. For this
//     service's own messages it is nil (JSON null) until the other
//     service's receipt arrives (see Receipt), then that side's inbox
//     commit time; for received messages it equals ReceivedAt.
//   - Version: 1 as sent, n+1 after each edit or the delete (0 is read as
//     1: an event from before versions).
//   - EditedAt: when the latest edit or the delete was made (nil: never).
//   - Deleted: the author deleted it; Body is then "".
//   - ReadAt: for this service's own messages, when someone on the other
//     side read it (the other service's read receipt, see ReadMark); nil
//     (JSON null) until then, and for received messages.
//   - TraceParent: not part of the JSON (neither event nor frame): the W3C
//     traceparent a received message arrived with ("" for none), kept in
//     its inbox row so that the gateway's push joins the sender's trace.
type Message struct {
	ID          string     `json:"id"`
	ChatID      int64      `json:"chat_id"`
	Seq         int64      `json:"seq"`
	Body        string     `json:"body"`
	SentAt      time.Time  `json:"sent_at"`
	From        string     `json:"from"`
	Author      string     `json:"author,omitempty"`
	ReceivedAt  *time.Time `json:"received_at,omitempty"`
	DeliveredAt *time.Time `json:"delivered_at"`
	Version     int64      `json:"version"`
	EditedAt    *time.Time `json:"edited_at,omitempty"`
	Deleted     bool       `json:"deleted"`
	ReadAt      *time.Time `json:"read_at"`
	TraceParent string     `json:"-"`
}

// MarshalJSON encodes times as RFC 3339 with microseconds in UTC;
// delivered_at and read_at are always present (null when not delivered or
// read yet), version always (at least 1), edited_at only once edited.
//
// The output is byte for byte what encoding/json makes of the fields in
// this order (HTML-safe string escapes included): the object is written
// directly because the gateway encodes every pushed message, and the
// reflection of a struct per frame was most of the frame's cost.
func (m Message) MarshalJSON() ([]byte, error) {
	return m.AppendJSON(make([]byte, 0, m.jsonSize())), nil
}

// EventJSON encodes m as a message.created payload: the fields the event
// carries (id, chat_id, seq, body, sent_at, from, author, delivered_at),
// without the version, deleted and read_at of history and frames, which a
// new message does not need: the send path pays no bytes for edits and
// reads. (The re-drive encodes the whole Message: a deleted message says
// so.)
func (m Message) EventJSON() ([]byte, error) {
	return m.appendEventJSON(make([]byte, 0, m.jsonSize())), nil
}

// optTime formats t, or returns nil for a nil t.
func optTime(t *time.Time) *string {
	if t == nil {
		return nil
	}
	s := formatTime(*t)
	return &s
}

const timeLayout = jsonenc.TimeLayout

func formatTime(t time.Time) string { return t.UTC().Format(timeLayout) }

// FieldError is a rejected input: Field names the offending field ("body",
// "chat_id", "after_seq", or "" for the document as a whole), Msg says why.
// HTTP handlers turn it into 400 {"error": Msg, "field": Field}.
type FieldError struct {
	Field string
	Msg   string
}

// Error returns "field: why", or just why when Field is "".
func (e *FieldError) Error() string {
	if e.Field == "" {
		return e.Msg
	}
	return e.Field + ": " + e.Msg
}

// ErrMalformedEvent wraps every error of DecodeEvent.
var ErrMalformedEvent = errors.New("malformed message event")

// ValidateBody checks a message body: not empty or only white space, at most maxBytes bytes (0
// means DefaultMaxBodyBytes), valid UTF-8, no NUL character. It returns a
// *FieldError for field "body", or nil.
func ValidateBody(body string, maxBytes int) error {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBodyBytes
	}
	switch {
	case strings.TrimSpace(body) == "":
		return &FieldError{Field: "body", Msg: "must not be empty or blank"}
	case len(body) > maxBytes:
		return &FieldError{Field: "body", Msg: fmt.Sprintf("is %d bytes, over the limit of %d", len(body), maxBytes)}
	case !utf8.ValidString(body):
		return &FieldError{Field: "body", Msg: "is not valid UTF-8"}
	case strings.IndexByte(body, 0) >= 0:
		return &FieldError{Field: "body", Msg: "must not contain NUL characters"}
	}
	return nil
}

// ParseChatID parses a chat id: a positive 64-bit decimal integer. It returns
// a *FieldError for field "chat_id".
func ParseChatID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 || strconv.FormatInt(id, 10) != s {
		return 0, &FieldError{Field: "chat_id", Msg: "must be a positive 64-bit integer"}
	}
	return id, nil
}

// ParseSeq parses a non-negative seq cursor for field name field ("" = 0).
func ParseSeq(field, s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, &FieldError{Field: field, Msg: "must be a non-negative 64-bit integer"}
	}
	return n, nil
}

// SendRequest is the body of POST /api/chats/{chat_id}/messages and of a
// WebSocket send frame: {"body": "...", "client_id": "..."}; client_id (the
// idempotency key) is optional.
type SendRequest struct {
	Body     string `json:"body"`
	ClientID string `json:"client_id,omitempty"`
}

// DecodeSendRequest decodes and validates a send request body: exactly one
// JSON object whose keys are "body" (required) and "client_id" (optional),
// matched exactly (no other key, no other spelling such as "Body", no
// repeated key), each a JSON string; body valid per ValidateBody, client_id
// per ValidateClientID, without unpaired UTF-16 surrogate escapes. Errors
// are *FieldError values naming the field ("" for the document as a whole).
func DecodeSendRequest(data []byte, maxBodyBytes int) (SendRequest, error) {
	var req SendRequest
	if !utf8.Valid(data) {
		return req, &FieldError{Field: "body", Msg: "request is not valid UTF-8"}
	}
	body, clientID, ok := scanSendRequest(data)
	if !ok {
		var err error
		if body, clientID, err = decodeSendRequestSlow(data); err != nil {
			return req, err
		}
	}
	return validSendRequest(*body, clientID, maxBodyBytes)
}

// validSendRequest returns the request of a decoded body and client_id
// (nil: none), or the *FieldError of ValidateBody or ValidateClientID.
func validSendRequest(body string, clientID *string, maxBodyBytes int) (SendRequest, error) {
	req := SendRequest{Body: body}
	if err := ValidateBody(req.Body, maxBodyBytes); err != nil {
		return req, err
	}
	if clientID != nil {
		if err := ValidateClientID("client_id", *clientID); err != nil {
			return req, err
		}
		req.ClientID = *clientID
	}
	return req, nil
}

// scanSendRequest is DecodeSendRequest's fast path, for the usual request:
// one object of "body" and, optionally, "client_id" (each once, in either
// order), both strings without escapes or control characters, white space
// anywhere JSON allows it, nothing after the object. It returns ok false
// for anything else (even valid JSON), which decodeSendRequestSlow then
// decodes, or refuses, with its precise error. data is valid UTF-8, so a
// string without escapes decodes to its bytes.
func scanSendRequest(data []byte) (body, clientID *string, ok bool) {
	i := skipJSONSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return nil, nil, false
	}
	for {
		key, j, ok := scanPlainString(data, skipJSONSpace(data, i+1))
		if !ok {
			return nil, nil, false
		}
		j = skipJSONSpace(data, j)
		if j >= len(data) || data[j] != ':' {
			return nil, nil, false
		}
		val, j, ok := scanPlainString(data, skipJSONSpace(data, j+1))
		if !ok {
			return nil, nil, false
		}
		switch {
		case key == "body" && body == nil:
			body = &val
		case key == "client_id" && clientID == nil:
			clientID = &val
		default:
			return nil, nil, false
		}
		i = skipJSONSpace(data, j)
		if i >= len(data) {
			return nil, nil, false
		}
		if data[i] == '}' {
			break
		}
		if data[i] != ',' {
			return nil, nil, false
		}
	}
	if skipJSONSpace(data, i+1) != len(data) || body == nil {
		return nil, nil, false
	}
	return body, clientID, true
}

// skipJSONSpace returns the index of the first byte of data at or after i
// that is not JSON white space.
func skipJSONSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// scanPlainString reads the JSON string at data[i] when it has no escape
// and no control character, and returns its text and the index after its
// closing quote; ok false otherwise.
func scanPlainString(data []byte, i int) (s string, next int, ok bool) {
	if i >= len(data) || data[i] != '"' {
		return "", 0, false
	}
	for j := i + 1; j < len(data); j++ {
		switch c := data[j]; {
		case c == '"':
			return string(data[i+1 : j]), j + 1, true
		case c == '\\' || c < 0x20:
			return "", 0, false
		}
	}
	return "", 0, false
}

// decodeSendRequestSlow decodes any send request with encoding/json's
// tokenizer, and gives DecodeSendRequest's errors for malformed ones. data
// is valid UTF-8.
func decodeSendRequestSlow(data []byte) (body, clientID *string, err error) {
	malformed := func(why string) error { return &FieldError{Field: "", Msg: "malformed JSON: " + why} }
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil {
		return nil, nil, malformed("expected an object")
	} else if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, nil, malformed("expected an object")
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, malformed("bad object key")
		}
		key, _ := tok.(string)
		var dst **string
		switch key {
		case "body":
			dst = &body
		case "client_id":
			dst = &clientID
		default:
			return nil, nil, &FieldError{Field: key, Msg: "unknown field (the fields are \"body\" and \"client_id\")"}
		}
		if *dst != nil {
			return nil, nil, &FieldError{Field: key, Msg: "given twice"}
		}
		tok, err = dec.Token()
		if err != nil {
			return nil, nil, malformed(fmt.Sprintf("bad value of %q", key))
		}
		str, ok := tok.(string)
		if !ok {
			return nil, nil, &FieldError{Field: key, Msg: "must be a string"}
		}
		*dst = &str
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return nil, nil, malformed("unterminated object")
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, nil, malformed("trailing data after the object")
	}
	if body == nil {
		return nil, nil, &FieldError{Field: "body", Msg: "is required"}
	}
	// encoding/json turns an unpaired surrogate escape ("\ud800") into
	// U+FFFD; refuse rather than silently change the text.
	var key string
	if clientID != nil {
		key = *clientID
	}
	if err := surrogateError(data, key); err != nil {
		return nil, nil, err
	}
	return body, clientID, nil
}

// surrogateError returns a *FieldError when data (a decoded JSON object)
// holds an unpaired surrogate escape, which encoding/json turned into
// U+FFFD: naming client_id when clientID, as decoded, holds U+FFFD, else
// body. Nil otherwise.
func surrogateError(data []byte, clientID string) error {
	if !hasUnpairedSurrogate(data) {
		return nil
	}
	field := "body"
	if strings.ContainsRune(clientID, utf8.RuneError) {
		field = "client_id"
	}
	return &FieldError{Field: field, Msg: "contains an unpaired UTF-16 surrogate escape"}
}

// hasUnpairedSurrogate reports whether JSON text data has a \uD800–\uDBFF
// escape not followed by a \uDC00–\uDFFF one, or a low one not preceded by
// a high one. Backslashes only occur inside strings in valid JSON, and "\\"
// is skipped as a pair, so every "\u" seen is an escape.
func hasUnpairedSurrogate(data []byte) bool {
	pendingHigh := false
	for i := 0; i < len(data); i++ {
		if data[i] != '\\' || i+1 >= len(data) {
			if pendingHigh && data[i] != '\\' {
				return true
			}
			continue
		}
		if data[i+1] != 'u' || i+5 >= len(data) {
			if pendingHigh {
				return true
			}
			i++ // skip the escaped character (e.g. the second '\\')
			continue
		}
		v, err := strconv.ParseUint(string(data[i+2:i+6]), 16, 16)
		if err != nil {
			return false // malformed; the decoder reports it
		}
		switch {
		case v >= 0xD800 && v <= 0xDBFF:
			if pendingHigh {
				return true
			}
			pendingHigh = true
		case v >= 0xDC00 && v <= 0xDFFF:
			if !pendingHigh {
				return true
			}
			pendingHigh = false
		default:
			if pendingHigh {
				return true
			}
		}
		i += 5
	}
	return pendingHigh
}

// maxAuthorBytes bounds an event's author (a token's sub).
const maxAuthorBytes = 256

// DecodeEvent decodes a message.created payload from the queue and checks it:
// id a UUID, chat_id > 0, seq > 0, body valid (any length up to 1 MiB, valid
// UTF-8, no NUL; or empty with deleted true: a deleted message re-driven), sent_at present, from a known service, author (optional)
// valid UTF-8 of at most 256 bytes without NUL. Unknown fields are
// ignored. Every error wraps ErrMalformedEvent.
func DecodeEvent(data []byte) (Message, error) {
	var m Message
	var raw eventFields
	if !scanEvent(data, &raw) {
		raw = eventFields{}
		if err := json.Unmarshal(data, &raw); err != nil {
			return m, fmt.Errorf("%w: %v", ErrMalformedEvent, err)
		}
	}
	if !isUUID(raw.ID) {
		return m, fmt.Errorf("%w: id %q is not a UUID", ErrMalformedEvent, raw.ID)
	}
	if raw.ChatID <= 0 {
		return m, fmt.Errorf("%w: chat_id must be positive", ErrMalformedEvent)
	}
	if raw.Seq <= 0 {
		return m, fmt.Errorf("%w: seq must be positive", ErrMalformedEvent)
	}
	if raw.Body == nil {
		return m, fmt.Errorf("%w: body missing", ErrMalformedEvent)
	}
	// A message deleted before the re-drive published it again has an
	// empty body; its message.deleted event (version 2 or more) follows.
	if err := ValidateBody(*raw.Body, 1<<20); err != nil && !(raw.Deleted && *raw.Body == "") {
		return m, fmt.Errorf("%w: %v", ErrMalformedEvent, err)
	}
	t, err := time.Parse(time.RFC3339Nano, raw.SentAt)
	if err != nil {
		return m, fmt.Errorf("%w: sent_at: %v", ErrMalformedEvent, err)
	}
	if Peer(raw.From) == "" {
		return m, fmt.Errorf("%w: from %q is not a known service", ErrMalformedEvent, raw.From)
	}
	if len(raw.Author) > maxAuthorBytes || !utf8.ValidString(raw.Author) || strings.IndexByte(raw.Author, 0) >= 0 {
		return m, fmt.Errorf("%w: author is not valid UTF-8 of at most %d bytes without NUL", ErrMalformedEvent, maxAuthorBytes)
	}
	return Message{ID: strings.ToLower(raw.ID), ChatID: raw.ChatID, Seq: raw.Seq, Body: *raw.Body, SentAt: t, From: raw.From, Author: raw.Author}, nil
}

// eventFields is a message.created event as DecodeEvent reads it, before
// its checks.
type eventFields struct {
	ID      string  `json:"id"`
	ChatID  int64   `json:"chat_id"`
	Seq     int64   `json:"seq"`
	Body    *string `json:"body"`
	SentAt  string  `json:"sent_at"`
	From    string  `json:"from"`
	Author  string  `json:"author"`
	Deleted bool    `json:"deleted"`
}

// eventKeys are eventFields' JSON names: a key that equals one of them
// only case-insensitively is json.Unmarshal's to match.
var eventKeys = [...]string{"id", "chat_id", "seq", "body", "sent_at", "from", "author", "deleted"}

// scanEvent is DecodeEvent's fast path, for the events the sender writes
// (Message.EventJSON): it fills f as json.Unmarshal would when data is one
// object whose keys are plain ASCII, whose fields of eventFields hold
// values of their own type (strings of valid UTF-8 without a surrogate
// escape; integers that fit int64; true or false) and whose other fields
// hold any valid JSON (within jsonscan.MaxDepth). For anything else (a
// string of invalid UTF-8 or with a surrogate escape, a null or mistyped
// field, a key json.Unmarshal would match case-insensitively, trailing
// data) it returns false, with f partly filled, and json.Unmarshal decodes
// or refuses the event. Repeated keys: the last wins, as in json.Unmarshal.
// The cases below and eventKeys must name eventFields' tags.
func scanEvent(data []byte, f *eventFields) bool {
	o := objectScan{S: jsonscan.Scanner{P: data}}
	s := &o.S
	for o.next() {
		var str *string
		ok := true
		switch key := string(o.key); key {
		case "id":
			str = &f.ID
		case "chat_id":
			f.ChatID, ok = s.Int64()
		case "seq":
			f.Seq, ok = s.Int64()
		case "body":
			f.Body = new(string)
			str = f.Body
		case "sent_at":
			str = &f.SentAt
		case "from":
			str = &f.From
		case "author":
			str = &f.Author
		case "deleted":
			f.Deleted, ok = s.Bool()
		default:
			for _, k := range eventKeys {
				if strings.EqualFold(key, k) {
					return false
				}
			}
			ok = s.Value(0)
		}
		if str != nil {
			*str, ok = scanEventText(s)
		}
		if !ok {
			return false
		}
	}
	return o.done()
}

// scanEventText consumes a string whose bytes are valid UTF-8 and whose
// escapes, if any, stand for no UTF-16 surrogate (the sender's encoder
// writes \n, \" and \u003c, never a surrogate), and returns its text as
// json.Unmarshal would; false for any other string.
func scanEventText(s *jsonscan.Scanner) (string, bool) {
	from, to, plain, valid := s.Str()
	if !valid {
		return "", false
	}
	b := s.P[from:to]
	if plain {
		return string(b), true
	}
	if !utf8.Valid(b) {
		return "", false // json.Unmarshal replaces the bad bytes
	}
	i := bytes.IndexByte(b, '\\')
	if i < 0 {
		return string(b), true
	}
	// Str checked every escape's form.
	out := make([]byte, 0, len(b))
	for i >= 0 {
		out = append(out, b[:i]...)
		c := b[i+1]
		b = b[i+2:]
		switch c {
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, err := strconv.ParseUint(string(b[:4]), 16, 32)
			if err != nil || utf16.IsSurrogate(rune(r)) {
				return "", false
			}
			out = utf8.AppendRune(out, rune(r))
			b = b[4:]
		default: // '"', '\\', '/'
			out = append(out, c)
		}
		i = bytes.IndexByte(b, '\\')
	}
	return string(append(out, b...)), true
}

// MaxClientIDBytes is the longest idempotency key, in bytes.
const MaxClientIDBytes = 128

// ValidateClientID checks an idempotency key (the Idempotency-Key header or
// the client_id field, named by field): 1 to MaxClientIDBytes (128) bytes of
// valid UTF-8 without NUL or other control characters. It returns a
// *FieldError for field, or nil.
func ValidateClientID(field, key string) error {
	switch {
	case key == "":
		return &FieldError{Field: field, Msg: "must not be empty"}
	case len(key) > MaxClientIDBytes:
		return &FieldError{Field: field, Msg: fmt.Sprintf("is %d bytes, over the limit of %d", len(key), MaxClientIDBytes)}
	case !utf8.ValidString(key):
		return &FieldError{Field: field, Msg: "is not valid UTF-8"}
	case strings.IndexFunc(key, unicode.IsControl) >= 0: // C0, DEL and C1
		return &FieldError{Field: field, Msg: "must not contain control characters"}
	}
	return nil
}
