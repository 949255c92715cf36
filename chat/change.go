package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"
)

// Edits, deletes and read receipts.
//
// An edit or a delete is a change of one message by its author, on the
// author's service: the message row takes version n+1 (with the new body,
// or an empty one and deleted = true) and the same transaction enqueues a
// Change event (EventMessageEdited or EventMessageDeleted) in the outbox.
// The row lock orders a message's changes, so their versions are 2, 3 …
// in commit order. The receiver applies a change only when its version is
// above the inbox row's (idempotent: a duplicate or an older version that
// arrives late changes nothing), and holds one whose message is not in
// its inbox yet until the message is (migration 009). So both sides end
// at the same latest version whatever the queue does to the order.
//
// A read receipt (EventMessageRead, ReadMark) says that a user of the
// sending service has read the other service's messages of a chat up to a
// seq. It travels like a delivery receipt (cumulative per chat: a lost or
// repeated one is harmless) and gives the other side's messages read_at.

// Event names of changes and read receipts.
const (
	EventMessageEdited  = "message.edited"
	EventMessageDeleted = "message.deleted"
	EventMessageRead    = "message.read"
)

// Errors of edits and deletes.
var (
	// ErrNoMessage: the chat holds no message of this service with that id.
	ErrNoMessage = errors.New("no such message in this chat")
	// ErrNotAuthor: the message was written by someone else.
	ErrNotAuthor = errors.New("only the author may change a message")
	// ErrDeletedMessage: the message is deleted; it cannot be edited.
	ErrDeletedMessage = errors.New("the message is deleted")
)

// Change is a message.edited or message.deleted event payload (JSON,
// snake_case):
//
//   - ID: the event's own UUID (the job's idempotency key).
//   - MessageID, ChatID, Seq: the message changed.
//   - Version: the message's version after the change (≥ 2).
//   - Body: the new body ("" for a delete).
//   - EditedAt: when the change was committed (RFC 3339, µs).
//   - Deleted: true for a delete.
//   - From: the service of the message (and of the change).
//   - Author: who changed it (the message's author).
type Change struct {
	ID        string    `json:"id"`
	MessageID string    `json:"message_id"`
	ChatID    int64     `json:"chat_id"`
	Seq       int64     `json:"seq"`
	Version   int64     `json:"version"`
	Body      string    `json:"body"`
	EditedAt  time.Time `json:"edited_at"`
	Deleted   bool      `json:"deleted"`
	From      string    `json:"from"`
	Author    string    `json:"author,omitempty"`
}

// Event returns the change's event name.
func (c Change) Event() string {
	if c.Deleted {
		return EventMessageDeleted
	}
	return EventMessageEdited
}

// DecodeChange decodes and checks a change payload delivered as event name:
// both ids UUIDs, chat_id, seq > 0, version ≥ 2, a body valid per
// ValidateBody (up to 1 MiB) for an edit and empty for a delete, deleted
// matching name, edited_at an RFC 3339 time, from a known service. Unknown
// fields are ignored. Every error wraps ErrMalformedEvent.
func DecodeChange(name string, data []byte) (Change, error) {
	var c Change
	var raw struct {
		ID        string `json:"id"`
		MessageID string `json:"message_id"`
		ChatID    int64  `json:"chat_id"`
		Seq       int64  `json:"seq"`
		Version   int64  `json:"version"`
		Body      string `json:"body"`
		EditedAt  string `json:"edited_at"`
		Deleted   bool   `json:"deleted"`
		From      string `json:"from"`
		Author    string `json:"author"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return c, fmt.Errorf("%w: change: %v", ErrMalformedEvent, err)
	}
	for _, id := range []string{raw.ID, raw.MessageID} {
		if !isUUID(id) {
			return c, fmt.Errorf("%w: change id %q is not a UUID", ErrMalformedEvent, id)
		}
	}
	switch {
	case raw.ChatID <= 0 || raw.Seq <= 0:
		return c, fmt.Errorf("%w: change chat_id and seq must be positive", ErrMalformedEvent)
	case raw.Version < 2 || raw.Version > 1<<31-1:
		return c, fmt.Errorf("%w: change version %d, want 2 or more", ErrMalformedEvent, raw.Version)
	case raw.Deleted != (name == EventMessageDeleted):
		return c, fmt.Errorf("%w: change deleted=%v does not match event %q", ErrMalformedEvent, raw.Deleted, name)
	case raw.Deleted && raw.Body != "":
		return c, fmt.Errorf("%w: a delete carries no body", ErrMalformedEvent)
	case Peer(raw.From) == "":
		return c, fmt.Errorf("%w: change from %q is not a known service", ErrMalformedEvent, raw.From)
	case len(raw.Author) > maxAuthorBytes || !utf8.ValidString(raw.Author) || strings.IndexByte(raw.Author, 0) >= 0:
		return c, fmt.Errorf("%w: change author is not valid UTF-8 of at most %d bytes without NUL", ErrMalformedEvent, maxAuthorBytes)
	}
	if !raw.Deleted {
		if err := ValidateBody(raw.Body, 1<<20); err != nil {
			return c, fmt.Errorf("%w: change: %v", ErrMalformedEvent, err)
		}
	}
	t, err := time.Parse(time.RFC3339Nano, raw.EditedAt)
	if err != nil {
		return c, fmt.Errorf("%w: change edited_at: %v", ErrMalformedEvent, err)
	}
	return Change{ID: strings.ToLower(raw.ID), MessageID: strings.ToLower(raw.MessageID), ChatID: raw.ChatID, Seq: raw.Seq,
		Version: raw.Version, Body: raw.Body, EditedAt: t, Deleted: raw.Deleted, From: raw.From, Author: raw.Author}, nil
}

// MarshalJSON writes the change with its time in RFC 3339, µs, UTC.
func (c Change) MarshalJSON() ([]byte, error) {
	type wire Change
	return json.Marshal(struct {
		wire
		EditedAt string `json:"edited_at"`
	}{wire(c), formatTime(c.EditedAt)})
}

// ChangeFrame is the WebSocket frame of an applied edit or delete:
//
//	{"type": "edit"|"delete", "chat_id": 1, "from": "consumers", "message_id": "…",
//	 "version": 2, "body": "…", "edited_at": "…", "deleted": false, "message": Message}
//
// message is the changed message at its latest version. Like a receipt
// frame it has no top-level "id" or "seq", so a client that reads only
// Message frames skips it. Pushed on both sides once the change is
// committed (sender) or applied (receiver).
type ChangeFrame struct {
	Message Message
}

// MarshalJSON writes the frame.
func (f ChangeFrame) MarshalJSON() ([]byte, error) {
	m := f.Message
	typ := "edit"
	if m.Deleted {
		typ = "delete"
	}
	inner, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	return json.Marshal(struct {
		Type      string          `json:"type"`
		ChatID    int64           `json:"chat_id"`
		From      string          `json:"from"`
		MessageID string          `json:"message_id"`
		Version   int64           `json:"version"`
		Body      string          `json:"body"`
		EditedAt  *string         `json:"edited_at"`
		Deleted   bool            `json:"deleted"`
		Message   json.RawMessage `json:"message"`
	}{typ, m.ChatID, m.From, m.ID, max(m.Version, 1), m.Body, optTime(m.EditedAt), m.Deleted, inner})
}

// ChangeChannel is the NOTIFY channel of changes committed or applied in
// service's schema; the payload is "chat_id:origin:message_id".
func ChangeChannel(service string) string { return service + "_changes" }

// ReadChannel is the NOTIFY channel of read receipts applied to service's
// messages; the payload is "chat_id:upto_seq:unix_µs" items joined by ","
// (as ReceiptChannel's).
func ReadChannel(service string) string { return service + "_reads" }

// ReadMark is a message.read event payload: a user of From has read the
// other service's messages of ChatID up to seq UptoSeq at ReadAt. ID is
// the event's UUID; Reader the user ("" without auth).
type ReadMark struct {
	ID      string    `json:"id"`
	ChatID  int64     `json:"chat_id"`
	UptoSeq int64     `json:"upto_seq"`
	ReadAt  time.Time `json:"read_at"`
	Reader  string    `json:"reader,omitempty"`
	From    string    `json:"from"`
}

// MarshalJSON writes the mark with its time in RFC 3339, µs, UTC.
func (r ReadMark) MarshalJSON() ([]byte, error) {
	type wire ReadMark
	return json.Marshal(struct {
		wire
		ReadAt string `json:"read_at"`
	}{wire(r), formatTime(r.ReadAt)})
}

// DecodeReadMark decodes and checks a message.read payload: id a UUID,
// chat_id and upto_seq > 0, read_at an RFC 3339 time, from a known service,
// reader (optional) valid UTF-8 of at most 256 bytes. Unknown fields are
// ignored. Every error wraps ErrMalformedEvent.
func DecodeReadMark(data []byte) (ReadMark, error) {
	var r ReadMark
	var raw struct {
		ID      string `json:"id"`
		ChatID  int64  `json:"chat_id"`
		UptoSeq int64  `json:"upto_seq"`
		ReadAt  string `json:"read_at"`
		Reader  string `json:"reader"`
		From    string `json:"from"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return r, fmt.Errorf("%w: read: %v", ErrMalformedEvent, err)
	}
	if !isUUID(raw.ID) {
		return r, fmt.Errorf("%w: read id %q is not a UUID", ErrMalformedEvent, raw.ID)
	}
	if raw.ChatID <= 0 || raw.UptoSeq <= 0 {
		return r, fmt.Errorf("%w: read chat_id and upto_seq must be positive", ErrMalformedEvent)
	}
	t, err := time.Parse(time.RFC3339Nano, raw.ReadAt)
	if err != nil {
		return r, fmt.Errorf("%w: read read_at: %v", ErrMalformedEvent, err)
	}
	if Peer(raw.From) == "" {
		return r, fmt.Errorf("%w: read from %q is not a known service", ErrMalformedEvent, raw.From)
	}
	if len(raw.Reader) > maxAuthorBytes || !utf8.ValidString(raw.Reader) {
		return r, fmt.Errorf("%w: read reader too long or not UTF-8", ErrMalformedEvent)
	}
	return ReadMark{ID: strings.ToLower(raw.ID), ChatID: raw.ChatID, UptoSeq: raw.UptoSeq, ReadAt: t, Reader: raw.Reader, From: raw.From}, nil
}

// ReadFrame is the WebSocket frame telling a room that From's messages of
// ChatID up to UptoSeq were read at ReadAt by someone on the other side:
//
//	{"type":"read","chat_id":1,"from":"consumers","upto_seq":7,"read_at":"…"}
//
// Pushed live on the messages' side when the read receipt is applied, and
// once when a socket opens (the room's newest).
type ReadFrame struct {
	ChatID  int64
	From    string
	UptoSeq int64
	ReadAt  time.Time
}

// MarshalJSON writes the frame with the time in RFC 3339, µs, UTC.
func (f ReadFrame) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Type    string `json:"type"`
		ChatID  int64  `json:"chat_id"`
		From    string `json:"from"`
		UptoSeq int64  `json:"upto_seq"`
		ReadAt  string `json:"read_at"`
	}{"read", f.ChatID, f.From, f.UptoSeq, formatTime(f.ReadAt)})
}

// DecodeEditRequest decodes the body of PATCH
// /api/chats/{chat_id}/messages/{message_id}: exactly {"body": "..."}
// (the rules of DecodeSendRequest, without client_id). Errors are
// *FieldError values naming the field.
func DecodeEditRequest(data []byte, maxBodyBytes int) (string, error) {
	req, err := DecodeSendRequest(data, maxBodyBytes)
	if err != nil {
		var fe *FieldError
		if errors.As(err, &fe) && fe.Field == "client_id" {
			return "", &FieldError{Field: "client_id", Msg: "unknown field (the field is \"body\")"}
		}
		if errors.As(err, &fe) && strings.HasPrefix(fe.Msg, "unknown field") {
			return "", &FieldError{Field: fe.Field, Msg: "unknown field (the field is \"body\")"}
		}
		return "", err
	}
	if req.ClientID != "" {
		return "", &FieldError{Field: "client_id", Msg: "unknown field (the field is \"body\")"}
	}
	return req.Body, nil
}

// DecodeReadRequest decodes the body of POST /api/chats/{chat_id}/read:
// exactly {"upto_seq": N} with N a non-negative 64-bit integer. Errors are
// *FieldError values naming the field ("" for the document).
func DecodeReadRequest(data []byte) (int64, error) {
	malformed := &FieldError{Field: "", Msg: "malformed JSON: expected an object {\"upto_seq\": N}"}
	notSeq := &FieldError{Field: "upto_seq", Msg: "must be a non-negative 64-bit integer"}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return 0, malformed
	}
	var n *json.Number
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return 0, malformed
		}
		key, _ := tok.(string)
		if key != "upto_seq" {
			return 0, &FieldError{Field: key, Msg: "unknown field (the field is \"upto_seq\")"}
		}
		if n != nil {
			return 0, &FieldError{Field: key, Msg: "given twice"}
		}
		if tok, err = dec.Token(); err != nil {
			return 0, malformed
		}
		num, ok := tok.(json.Number) // null, a string, an object: not a seq
		if !ok {
			return 0, notSeq
		}
		n = &num
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return 0, malformed
	}
	if _, err := dec.Token(); err != io.EOF {
		return 0, &FieldError{Field: "", Msg: "malformed JSON: trailing data after the object"}
	}
	if n == nil {
		return 0, &FieldError{Field: "upto_seq", Msg: "is required"}
	}
	return ParseSeq("upto_seq", n.String())
}

// ParseMessageID parses a message id in a path: a UUID in its canonical
// 36-character form. It returns it lower-cased, or a *FieldError for field
// "message_id".
func ParseMessageID(s string) (string, error) {
	if !isUUID(s) {
		return "", &FieldError{Field: "message_id", Msg: "must be a UUID"}
	}
	return strings.ToLower(s), nil
}
