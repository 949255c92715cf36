package chat

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

const (
	testID  = "018f0000-0000-7000-8000-000000000001"
	testMsg = "018f0000-0000-7000-8000-000000000002"
)

func TestDecodeChange(t *testing.T) {
	ok := Change{ID: testID, MessageID: testMsg, ChatID: 1, Seq: 2, Version: 3, Body: "new", EditedAt: time.Now(), From: Consumers, Author: "a"}
	b, _ := json.Marshal(ok)
	if c, err := DecodeChange(EventMessageEdited, b); err != nil || c.Version != 3 || c.Body != "new" || c.MessageID != testMsg {
		t.Fatalf("edit: %+v %v", c, err)
	}
	del := ok
	del.Body, del.Deleted = "", true
	b, _ = json.Marshal(del)
	if c, err := DecodeChange(EventMessageDeleted, b); err != nil || !c.Deleted {
		t.Fatalf("delete: %+v %v", c, err)
	}
	for name, mut := range map[string]func(*Change){
		"version 1":         func(c *Change) { c.Version = 1 },
		"empty edit body":   func(c *Change) { c.Body = "" },
		"bad message id":    func(c *Change) { c.MessageID = "x" },
		"unknown service":   func(c *Change) { c.From = "nobody" },
		"zero chat":         func(c *Change) { c.ChatID = 0 },
		"delete named edit": func(c *Change) { c.Deleted, c.Body = true, "" },
	} {
		c := ok
		mut(&c)
		b, _ := json.Marshal(c)
		if _, err := DecodeChange(EventMessageEdited, b); !errors.Is(err, ErrMalformedEvent) {
			t.Errorf("%s: %v, want malformed", name, err)
		}
	}
	if _, err := DecodeChange(EventMessageDeleted, mustJSON(ok)); !errors.Is(err, ErrMalformedEvent) {
		t.Errorf("an edit named message.deleted: %v", err)
	}
}

func mustJSON(v any) []byte { b, _ := json.Marshal(v); return b }

func TestDecodeReadRequest(t *testing.T) {
	for in, want := range map[string]string{
		`{"upto_seq": 7}`:                "",
		`{"upto_seq": 0}`:                "",
		`{"upto_seq": -1}`:               "upto_seq",
		`{"upto_seq": "7"}`:              "upto_seq",
		`{"upto_seq": 1.5}`:              "upto_seq",
		`{}`:                             "upto_seq",
		`{"upto_seq": 1, "x": 2}`:        "x",
		`[1]`:                            "",
		`null`:                           "",
		`{"upto_seq": 99999999999999}`:   "",
		`{"upto_seq": null}`:             "upto_seq",
		`{"upto_seq": 1, "upto_seq": 0}`: "upto_seq",
		`{"upto_seq": {"a": 1}}`:         "upto_seq",
	} {
		n, err := DecodeReadRequest([]byte(in))
		var fe *FieldError
		switch {
		case want == "" && strings.HasPrefix(in, `{"upto_seq": `) && err != nil:
			t.Errorf("%s: %v", in, err)
		case want != "" && (!errors.As(err, &fe) || fe.Field != want):
			t.Errorf("%s: %v (n %d), want an error naming %q", in, err, n, want)
		case (in == `[1]` || in == `null`) && err == nil:
			t.Errorf("%s: no error", in)
		}
	}
}

// A deleted message published again by the re-drive has an empty body and
// deleted true: accepted; an empty body otherwise is not.
func TestDecodeEventOfDeletedMessage(t *testing.T) {
	m := Message{ID: testMsg, ChatID: 1, Seq: 1, Body: "", SentAt: time.Now(), From: Workers, Deleted: true}
	if _, err := DecodeEvent(mustJSON(m)); err != nil {
		t.Fatalf("deleted, empty: %v", err)
	}
	m.Deleted = false
	if _, err := DecodeEvent(mustJSON(m)); !errors.Is(err, ErrMalformedEvent) {
		t.Fatalf("not deleted, empty: %v", err)
	}
}

func FuzzDecodeChange(f *testing.F) {
	f.Add(EventMessageEdited, string(mustJSON(Change{ID: testID, MessageID: testMsg, ChatID: 1, Seq: 1, Version: 2, Body: "b", EditedAt: time.Now(), From: Workers})))
	f.Add(EventMessageDeleted, `{"id":"`+testID+`","message_id":"`+testMsg+`","chat_id":1,"seq":1,"version":9,"body":"","deleted":true,"edited_at":"2026-01-01T00:00:00Z","from":"consumers"}`)
	f.Fuzz(func(t *testing.T, name, data string) {
		c, err := DecodeChange(name, []byte(data))
		if err != nil {
			if !errors.Is(err, ErrMalformedEvent) {
				t.Fatalf("error %v does not wrap ErrMalformedEvent", err)
			}
			return
		}
		if c.Version < 2 || c.ChatID <= 0 || c.Deleted != (name == EventMessageDeleted) || (c.Deleted && c.Body != "") {
			t.Fatalf("accepted a bad change: %+v", c)
		}
		if _, err := DecodeChange(c.Event(), mustJSON(c)); err != nil {
			t.Fatalf("round trip: %v", err)
		}
	})
}

func FuzzDecodeReadRequest(f *testing.F) {
	for _, s := range []string{`{"upto_seq": 3}`, `{"upto_seq": -3}`, `{}`, `{"upto_seq": 1e3}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data string) {
		n, err := DecodeReadRequest([]byte(data))
		var fe *FieldError
		if err != nil && !errors.As(err, &fe) {
			t.Fatalf("error %v is not a FieldError", err)
		}
		if err == nil && n < 0 {
			t.Fatalf("negative seq %d accepted", n)
		}
	})
}

func FuzzDecodeReadMark(f *testing.F) {
	f.Add(string(mustJSON(ReadMark{ID: testID, ChatID: 1, UptoSeq: 2, ReadAt: time.Now(), From: Consumers})))
	f.Fuzz(func(t *testing.T, data string) {
		r, err := DecodeReadMark([]byte(data))
		if err != nil {
			if !errors.Is(err, ErrMalformedEvent) {
				t.Fatalf("error %v does not wrap ErrMalformedEvent", err)
			}
			return
		}
		if r.ChatID <= 0 || r.UptoSeq <= 0 || Peer(r.From) == "" {
			t.Fatalf("accepted a bad mark: %+v", r)
		}
	})
}

// TestParseChatCursorRange: a cursor whose time no message can have (out
// of years 1–9999, where Postgres's range ends too) is a 400 on the
// cursor, not a query the database refuses.
func TestParseChatCursorRange(t *testing.T) {
	for in, ok := range map[string]bool{
		"1796169629949000.5":     true,
		"-210866803200000001.1":  false,
		"-9000000000000000000.1": false,
		"9223372036854775807.1":  false,
		"0.1":                    true,
	} {
		_, err := ParseChatCursor(in)
		var fe *FieldError
		if ok != (err == nil) || (!ok && (!errors.As(err, &fe) || fe.Field != "cursor")) {
			t.Errorf("ParseChatCursor(%q) = %v, want ok %v (else an error naming cursor)", in, err, ok)
		}
	}
}
