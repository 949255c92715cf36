package chat

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/outboxchat/outboxchat/chat/internal/jsonenc"
	"github.com/outboxchat/outboxchat/chat/internal/jsonscan"
)

// Client frame types of the WebSocket: what a client may send on its socket
// besides the {"token"} first frame.
const (
	FrameSend   = "send"
	FrameEdit   = "edit"
	FrameDelete = "delete"
	FrameRead   = "read"
	FrameTyping = "typing"
)

// ClientFrame is a decoded client frame (JSON):
//
//	{"type":"send","client_id":"…","body":"…"[,"chat_id":N]}
//	{"type":"edit","client_id":"…","message_id":"<uuid>","body":"…"[,"chat_id":N]}
//	{"type":"delete","client_id":"…","message_id":"<uuid>"[,"chat_id":N]}
//	{"type":"read","client_id":"…","upto_seq":N[,"chat_id":N]}
//	{"type":"typing"}
//
// ClientID correlates the answer (an ack or an error frame); for a send it
// is also the idempotency key, with the contract of the HTTP
// Idempotency-Key. ChatID is 0 when the frame names no chat (the socket's
// chat then). MessageID is lower-cased.
type ClientFrame struct {
	Type      string
	ClientID  string
	Body      string
	MessageID string
	ChatID    int64
	UptoSeq   int64
	// Untyped is set, with the "type is required" error, for an object
	// of known keys without "type": the older protocol's send frame
	// ({"body": "…"[, "client_id": "…"]}), which its callers may still
	// take as such.
	Untyped bool
}

// frameFields are the keys a client frame may hold.
const frameFields = `"type", "client_id", "body", "message_id", "chat_id" and "upto_seq"`

// DecodeClientFrame decodes and validates a client frame: one JSON object
// of the keys of ClientFrame (snake_case, each at most once, no other),
// strings for type, client_id, body and message_id, integers for chat_id
// and upto_seq; then the fields its type needs: client_id (ValidateClientID)
// for all but typing, body (ValidateBody with maxBodyBytes, 0 meaning
// DefaultMaxBodyBytes) for send and edit, message_id (a UUID) for edit and
// delete, upto_seq (≥ 0) for read, chat_id (positive) when given; a field
// the type does not take is refused. Errors are *FieldError values naming
// the field ("" for the document); f.ClientID is set whenever it was read,
// even on an error, so that the error frame can name it. Safe for
// concurrent use.
func DecodeClientFrame(data []byte, maxBodyBytes int) (f ClientFrame, err error) {
	if !utf8.Valid(data) {
		return f, &FieldError{Field: "", Msg: "frame is not valid UTF-8"}
	}
	var seen frameSeen
	if !scanClientFrame(data, &f, &seen) {
		f, seen = ClientFrame{}, frameSeen{}
		if err := decodeClientFrameSlow(data, &f, &seen); err != nil {
			return f, err
		}
		// As DecodeSendRequest: encoding/json turns an unpaired surrogate
		// escape into U+FFFD, which would change the text, and make
		// client_ids that differ there one idempotency key.
		if err := surrogateError(data, f.ClientID); err != nil {
			return f, err
		}
	}
	return f, checkClientFrame(&f, &seen, maxBodyBytes)
}

// frameSeen records which keys a frame held.
type frameSeen struct {
	typ, clientID, body, messageID, chatID, uptoSeq bool
}

// field returns the flag of key, nil for an unknown key.
func (s *frameSeen) field(key string) *bool {
	switch key {
	case "type":
		return &s.typ
	case "client_id":
		return &s.clientID
	case "body":
		return &s.body
	case "message_id":
		return &s.messageID
	case "chat_id":
		return &s.chatID
	case "upto_seq":
		return &s.uptoSeq
	}
	return nil
}

// scanClientFrame is DecodeClientFrame's fast path: an object of known
// keys, each once, with strings free of escapes and integers that fit
// int64. It returns false for anything else, which the slow path decodes
// or refuses with its precise error.
func scanClientFrame(data []byte, f *ClientFrame, seen *frameSeen) bool {
	o := objectScan{S: jsonscan.Scanner{P: data}}
	s := &o.S
	for o.next() {
		if !o.keyValid {
			return false
		}
		key := o.key
		var flag *bool
		switch string(key) {
		case "chat_id", "upto_seq":
			n, ok := s.Int64()
			if !ok {
				return false
			}
			if string(key) == "chat_id" {
				flag, f.ChatID = &seen.chatID, n
			} else {
				flag, f.UptoSeq = &seen.uptoSeq, n
			}
		default:
			vf, vt, plain, valid := s.Str()
			if !plain || !valid {
				return false
			}
			v := data[vf:vt]
			switch string(key) {
			case "type":
				flag, f.Type = &seen.typ, frameTypeName(v)
			case "client_id":
				flag, f.ClientID = &seen.clientID, string(v)
			case "body":
				flag, f.Body = &seen.body, string(v)
			case "message_id":
				flag, f.MessageID = &seen.messageID, string(v)
			default:
				return false
			}
		}
		if *flag {
			return false // given twice: the slow path names it
		}
		*flag = true
	}
	return o.done()
}

// frameTypeName returns the type's constant for a known type (no
// allocation), else a copy of v.
func frameTypeName(v []byte) string {
	for _, t := range [...]string{FrameSend, FrameEdit, FrameDelete, FrameRead, FrameTyping} {
		if string(v) == t {
			return t
		}
	}
	return string(v)
}

// decodeClientFrameSlow decodes any client frame with encoding/json's
// tokenizer and gives DecodeClientFrame's errors for malformed ones.
func decodeClientFrameSlow(data []byte, f *ClientFrame, seen *frameSeen) error {
	malformed := func(why string) error { return &FieldError{Field: "", Msg: "malformed JSON: " + why} }
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return malformed("expected an object")
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return malformed("bad object key")
		}
		key, _ := tok.(string)
		flag := seen.field(key)
		if flag == nil {
			return &FieldError{Field: key, Msg: "unknown field (the fields are " + frameFields + ")"}
		}
		if *flag {
			return &FieldError{Field: key, Msg: "given twice"}
		}
		*flag = true
		if tok, err = dec.Token(); err != nil {
			return malformed(fmt.Sprintf("bad value of %q", key))
		}
		switch key {
		case "chat_id", "upto_seq":
			num, ok := tok.(json.Number)
			n, err := strconv.ParseInt(string(num), 10, 64)
			if !ok || err != nil {
				return &FieldError{Field: key, Msg: "must be a 64-bit integer"}
			}
			if key == "chat_id" {
				f.ChatID = n
			} else {
				f.UptoSeq = n
			}
		default:
			str, ok := tok.(string)
			if !ok {
				return &FieldError{Field: key, Msg: "must be a string"}
			}
			switch key {
			case "type":
				f.Type = str
			case "client_id":
				f.ClientID = str
			case "body":
				f.Body = str
			case "message_id":
				f.MessageID = str
			}
		}
	}
	if _, err := dec.Token(); err != nil {
		return malformed("unterminated object")
	}
	if _, err := dec.Token(); err != io.EOF {
		return malformed("trailing data after the object")
	}
	return nil
}

// checkClientFrame checks the fields f's type needs and refuses those it
// does not take.
func checkClientFrame(f *ClientFrame, seen *frameSeen, maxBodyBytes int) error {
	var need, take frameSeen // take: allowed besides need
	switch f.Type {
	case FrameSend:
		need, take = frameSeen{typ: true, clientID: true, body: true}, frameSeen{chatID: true}
	case FrameEdit:
		need, take = frameSeen{typ: true, clientID: true, body: true, messageID: true}, frameSeen{chatID: true}
	case FrameDelete:
		need, take = frameSeen{typ: true, clientID: true, messageID: true}, frameSeen{chatID: true}
	case FrameRead:
		need, take = frameSeen{typ: true, clientID: true, uptoSeq: true}, frameSeen{chatID: true}
	case FrameTyping:
		need, take = frameSeen{typ: true}, frameSeen{chatID: true, clientID: true}
	case "":
		if !seen.typ {
			f.Untyped = true
			return &FieldError{Field: "type", Msg: "is required (send, edit, delete, read or typing)"}
		}
		fallthrough
	default:
		return &FieldError{Field: "type", Msg: fmt.Sprintf("unknown frame type %q (send, edit, delete, read or typing)", f.Type)}
	}
	if seen.clientID {
		if err := ValidateClientID("client_id", f.ClientID); err != nil {
			return err
		}
	}
	for _, k := range [...]string{"client_id", "body", "message_id", "chat_id", "upto_seq"} {
		has, needs, takes := *seen.field(k), *need.field(k), *take.field(k)
		switch {
		case needs && !has:
			return &FieldError{Field: k, Msg: "is required in a " + f.Type + " frame"}
		case has && !needs && !takes:
			return &FieldError{Field: k, Msg: "is not a field of a " + f.Type + " frame"}
		}
	}
	if seen.chatID && f.ChatID <= 0 {
		return &FieldError{Field: "chat_id", Msg: "must be a positive 64-bit integer"}
	}
	if need.body {
		if err := ValidateBody(f.Body, maxBodyBytes); err != nil {
			return err
		}
	}
	if need.messageID {
		id, err := ParseMessageID(f.MessageID)
		if err != nil {
			return err
		}
		f.MessageID = id
	}
	if need.uptoSeq && f.UptoSeq < 0 {
		return &FieldError{Field: "upto_seq", Msg: "must be a non-negative 64-bit integer"}
	}
	return nil
}

// AppendAckFrame appends the answer to a send frame (JSON, compact):
// {"type":"ack","client_id":…,"id":…,"chat_id":N,"seq":N,"sent_at":"…"}.
// A repeat of a client_id gets the same bytes (the first message's id,
// seq and time). It never fails.
func AppendAckFrame(dst []byte, clientID string, m Message) []byte {
	dst = append(dst, `{"type":"ack","client_id":`...)
	dst = jsonenc.AppendString(dst, clientID)
	dst = append(dst, `,"id":`...)
	dst = jsonenc.AppendString(dst, m.ID)
	dst = append(dst, `,"chat_id":`...)
	dst = strconv.AppendInt(dst, m.ChatID, 10)
	dst = append(dst, `,"seq":`...)
	dst = strconv.AppendInt(dst, m.Seq, 10)
	dst = append(dst, `,"sent_at":`...)
	dst = jsonenc.AppendTime(dst, m.SentAt)
	return append(dst, '}')
}

// AppendChangeAckFrame appends the answer to an edit or delete frame:
// {"type":"ack","client_id":…,"message":<Message at its new version>}.
func AppendChangeAckFrame(dst []byte, clientID string, m Message) []byte {
	dst = append(dst, `{"type":"ack","client_id":`...)
	dst = jsonenc.AppendString(dst, clientID)
	dst = append(dst, `,"message":`...)
	dst = m.AppendJSON(dst)
	return append(dst, '}')
}

// AppendReadAckFrame appends the answer to a read frame:
// {"type":"ack","client_id":…,"chat_id":N,"upto_seq":N,"read_at":"…","unread":N}.
func AppendReadAckFrame(dst []byte, clientID string, r ReadResult) []byte {
	dst = append(dst, `{"type":"ack","client_id":`...)
	dst = jsonenc.AppendString(dst, clientID)
	dst = append(dst, `,"chat_id":`...)
	dst = strconv.AppendInt(dst, r.ChatID, 10)
	dst = append(dst, `,"upto_seq":`...)
	dst = strconv.AppendInt(dst, r.UptoSeq, 10)
	dst = append(dst, `,"read_at":`...)
	dst = jsonenc.AppendTime(dst, r.ReadAt)
	dst = append(dst, `,"unread":`...)
	dst = strconv.AppendInt(dst, r.Unread, 10)
	return append(dst, '}')
}

// AppendErrorFrame appends the answer to a refused or failed frame:
// {"type":"error","client_id":…,"error":…,"field":…}; client_id is ""
// when the frame carried none (or it did not parse), field "" when the
// error is not about one field.
func AppendErrorFrame(dst []byte, clientID, msg, field string) []byte {
	dst = append(dst, `{"type":"error","client_id":`...)
	dst = jsonenc.AppendString(dst, clientID)
	dst = append(dst, `,"error":`...)
	dst = jsonenc.AppendString(dst, msg)
	dst = append(dst, `,"field":`...)
	dst = jsonenc.AppendString(dst, field)
	return append(dst, '}')
}

// AckFrame is an ack or error frame as a client decodes it (the lab's
// bench, tests): Type "ack" or "error"; Error and Field only on errors.
type AckFrame struct {
	Type     string    `json:"type"`
	ClientID string    `json:"client_id"`
	ID       string    `json:"id"`
	ChatID   int64     `json:"chat_id"`
	Seq      int64     `json:"seq"`
	SentAt   time.Time `json:"sent_at"`
	Error    string    `json:"error"`
	Field    string    `json:"field"`
}
