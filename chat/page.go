package chat

import (
	"strconv"
	"strings"
	"time"
)

// Page is one page of a chat read newest first (the store's Latest).
//
// Messages are both origins merged, oldest first. MoreBefore is true when
// older messages exist. BeforeSent and BeforeReceived are the cursors of
// the next older page (the lowest seq of each origin in this page, or the
// cursor given when the page holds none of that origin; 0: no bound).
type Page struct {
	Messages                   []Message
	MoreBefore                 bool
	BeforeSent, BeforeReceived int64
	// TopSent and TopReceived are the newest seq of each origin below the
	// cursors (0: none), whether or not the page holds it.
	TopSent, TopReceived int64
}

// ChatSummary is one entry of the chat list: the chat, its newest message
// of either origin (a preview: delivered_at and read_at are not looked up)
// and the reader's count of unread messages of the other service.
type ChatSummary struct {
	ChatID      int64   `json:"chat_id"`
	LastMessage Message `json:"last_message"`
	Unread      int64   `json:"unread"`
}

// ChatCursor is the position after a chat of the list: its newest
// message's time and its id. The zero value is the start of the list.
type ChatCursor struct {
	At     time.Time
	ChatID int64
}

// String encodes the cursor as "<unix µs>.<chat id>".
func (c ChatCursor) String() string {
	return strconv.FormatInt(c.At.UnixMicro(), 10) + "." + strconv.FormatInt(c.ChatID, 10)
}

// ParseChatCursor decodes a cursor from ChatCursor.String ("" is the start).
// It returns a *FieldError for field "cursor".
// The bounds of a chat cursor's time, in Unix microseconds.
var (
	minCursorMicros = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	maxCursorMicros = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC).UnixMicro()
)

func ParseChatCursor(s string) (ChatCursor, error) {
	if s == "" {
		return ChatCursor{}, nil
	}
	bad := &FieldError{Field: "cursor", Msg: "must be a cursor from a previous page"}
	a, b, ok := strings.Cut(s, ".")
	if !ok {
		return ChatCursor{}, bad
	}
	us, err1 := strconv.ParseInt(a, 10, 64)
	id, err2 := strconv.ParseInt(b, 10, 64)
	// A cursor's time is a message's: years 1 to 9999, well inside
	// Postgres's timestamp range (a time outside it fails the query).
	if err1 != nil || err2 != nil || id <= 0 || us < minCursorMicros || us > maxCursorMicros {
		return ChatCursor{}, bad
	}
	return ChatCursor{At: time.UnixMicro(us), ChatID: id}, nil
}

// ReadResult is the outcome of MarkRead: the reader's mark in the chat,
// when it was set, and the reader's unread count after it.
type ReadResult struct {
	ChatID  int64     `json:"chat_id"`
	UptoSeq int64     `json:"upto_seq"`
	ReadAt  time.Time `json:"read_at"`
	Unread  int64     `json:"unread"`
}
