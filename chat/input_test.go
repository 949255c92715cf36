package chat

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/chat/internal/jsonscan"
)

func TestDecodeSendRequest(t *testing.T) {
	t.Parallel()
	req, err := DecodeSendRequest([]byte(`{"body":"héllo"}`), 0)
	if err != nil || req.Body != "héllo" {
		t.Fatalf("got %+v, %v", req, err)
	}
	_, err = DecodeSendRequest([]byte(`{"body":"abcdef"}`), 5)
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "body" {
		t.Fatalf("over a 5-byte limit: %v, want a body FieldError", err)
	}
}

func TestDecodeEvent(t *testing.T) {
	t.Parallel()
	good := `{"id":"0b5c6f5e-5d2e-4b8a-9f53-1d2e3f4a5b6c","chat_id":3,"seq":2,"body":"hi","sent_at":"2026-11-30T07:00:00.123456Z","from":"consumers","extra":{"grows":true}}`
	m, err := DecodeEvent([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if m.ChatID != 3 || m.Seq != 2 || m.Body != "hi" || m.From != Consumers || m.SentAt.Nanosecond() != 123456000 {
		t.Fatalf("decoded %+v", m)
	}
	bad := map[string]string{
		"not json":      `{`,
		"id not uuid":   strings.Replace(good, "0b5c6f5e-5d2e-4b8a-9f53-1d2e3f4a5b6c", "x", 1),
		"chat id zero":  strings.Replace(good, `"chat_id":3`, `"chat_id":0`, 1),
		"seq missing":   strings.Replace(good, `"seq":2,`, ``, 1),
		"body missing":  strings.Replace(good, `"body":"hi",`, ``, 1),
		"body empty":    strings.Replace(good, `"body":"hi"`, `"body":""`, 1),
		"bad time":      strings.Replace(good, `2026-11-30T07:00:00.123456Z`, `yesterday`, 1),
		"unknown from":  strings.Replace(good, `"from":"consumers"`, `"from":"mallory"`, 1),
		"chat id float": strings.Replace(good, `"chat_id":3`, `"chat_id":3.5`, 1),
	}
	for name, in := range bad {
		if _, err := DecodeEvent([]byte(in)); !errors.Is(err, ErrMalformedEvent) {
			t.Errorf("%s: err %v, want ErrMalformedEvent", name, err)
		}
	}
}

func TestMessageJSONRoundTrip(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 30, 7, 0, 0, 123456789, time.UTC)
	m := Message{ID: "0b5c6f5e-5d2e-4b8a-9f53-1d2e3f4a5b6c", ChatID: 1, Seq: 1, Body: "x", SentAt: at, From: Workers}
	b, _ := json.Marshal(m)
	if !strings.Contains(string(b), `"sent_at":"2026-11-30T07:00:00.123456Z"`) || strings.Contains(string(b), "received_at") {
		t.Fatalf("encoded %s", b)
	}
	back, err := DecodeEvent(b)
	if err != nil || !back.SentAt.Equal(at.Truncate(time.Microsecond)) {
		t.Fatalf("round trip: %+v %v", back, err)
	}
}

func FuzzDecodeSendRequest(f *testing.F) {
	for _, s := range []string{`{"body":"x"}`, `{"body":""}`, `{}`, `{"body":"a\u0000"}`, "{\"body\":\"\xff\"}", `[1]`, `{"body":"x","y":1}`, `{"body":"x"} {}`, `{"body":"\ud83d\ude00"}`, `{"body":"\ud800"}`, `{"Body":"x"}`, `{"body":"a","body":"b"}`, `{"body":"\\u0041"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := DecodeSendRequest(data, 64)
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("error %v is not a *FieldError", err)
			}
			return
		}
		if ValidateBody(req.Body, 64) != nil {
			t.Fatalf("accepted an invalid body %q", req.Body)
		}
		if hasUnpairedSurrogate(data) {
			t.Fatalf("accepted %q with an unpaired surrogate", data)
		}
	})
}

func FuzzDecodeEvent(f *testing.F) {
	f.Add([]byte(`{"id":"0b5c6f5e-5d2e-4b8a-9f53-1d2e3f4a5b6c","chat_id":3,"seq":2,"body":"hi","sent_at":"2026-11-30T07:00:00.123456Z","from":"consumers"}`))
	f.Add([]byte(`{"id":"","chat_id":-1}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := DecodeEvent(data)
		if err != nil {
			if !errors.Is(err, ErrMalformedEvent) {
				t.Fatalf("error %v does not wrap ErrMalformedEvent", err)
			}
			return
		}
		if m.ChatID <= 0 || m.Seq <= 0 || Peer(m.From) == "" || ValidateBody(m.Body, 1<<20) != nil {
			t.Fatalf("accepted an invalid event %+v", m)
		}
	})
}

func TestHasUnpairedSurrogate(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]bool{
		`{"body":"x"}`:                  false,
		`{"body":"\ud83d\ude00"}`:       false, // a pair: 😀
		`{"body":"\ud83d"}`:             true,
		`{"body":"\ude00"}`:             true,
		`{"body":"\ud83dx"}`:            true,
		`{"body":"\ud83d\n"}`:           true,
		`{"body":"\\ud83d"}`:            false, // an escaped backslash, then text
		`{"body":"\ufffd\ud800"}`:       true,
		`{"body":"\ud83d\ud83d\ude00"}`: true,
	} {
		if got := hasUnpairedSurrogate([]byte(in)); got != want {
			t.Errorf("hasUnpairedSurrogate(%s) = %v, want %v", in, got, want)
		}
	}
}

// checkScanEvent fails t when scanEvent takes data and fills its fields
// otherwise than json.Unmarshal does, or takes what json.Unmarshal
// refuses; it reports whether scanEvent took data.
func checkScanEvent(t *testing.T, data []byte) bool {
	t.Helper()
	var got eventFields
	if !scanEvent(data, &got) {
		return false
	}
	var want eventFields
	if err := json.Unmarshal(data, &want); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("scanEvent(%q) = %+v; json.Unmarshal: %+v, %v", data, got, want, err)
	}
	return true
}

func TestScanEventMatchesUnmarshal(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 4, 18, 0, 0, 123456000, time.UTC)
	sent, err := Message{ID: "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", ChatID: 42, Seq: 7, Body: "héllo 😀 <b>", SentAt: at,
		From: Consumers, Author: "alice"}.EventJSON()
	if err != nil {
		t.Fatal(err)
	}
	escaped, err := Message{ID: "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", ChatID: 42, Seq: 7, Body: "two\nlines \"q\"", SentAt: at,
		From: Consumers}.EventJSON()
	if err != nil {
		t.Fatal(err)
	}
	deep := strings.Repeat(`[`, jsonscan.MaxDepth+2) + strings.Repeat(`]`, jsonscan.MaxDepth+2)
	for _, c := range []struct {
		in   string
		fast bool // scanEvent takes it (else json.Unmarshal decides)
	}{
		{string(sent), true}, // what the sender writes, non-ASCII body and all
		{string(escaped), true},
		{`{"body":"\u00e9\u2028\/\\\b\f\r\t\u0041x"}`, true},
		{`{"body":"\ud83d\ude00"}`, false}, {`{"body":"\ud800"}`, false}, {`{"body":"\u12"}`, false}, {`{"body":"\x"}`, false},
		{` { } `, true},
		{`{"body":"a","body":"b","seq":1,"seq":2}`, true}, // the last wins
		{`{"x":{"y":[1,-2.5e3,{"z":null}],"w":"\u00e9"},"deleted":true}`, true},
		{`{"delivered_at":null,"version":3,"seqx":1}`, true},
		{`{"deleted":false,"author":""}`, true},
		{`{"ID":"x"}`, false}, {`{"Seq":1}`, false}, {`{"chat_ID":1}`, false}, // case-insensitive matches
		{`{"s\u0065q":1}`, false}, // an escaped key
		{`{"body":null}`, false}, {`{"seq":null}`, false},
		{`{"chat_id":1.5}`, false}, {`{"chat_id":1e2}`, false}, {`{"chat_id":"1"}`, false}, {`{"chat_id":01}`, false},
		{`{"seq":9223372036854775808}`, false}, {`{"seq":-9223372036854775808}`, true},
		{`{"deleted":1}`, false}, {`{"deleted":"true"}`, false}, {`{"body":1}`, false},
		{"{\"body\":\"bad \xff\"}", false}, {"{\"body\":\"tab\there\"}", false},
		{`{} x`, false}, {`{}}`, false}, {`{"a":1,}`, false}, {`{"a" 1}`, false}, {`{"a":1`, false},
		{`null`, false}, {`[]`, false}, {``, false}, {`{"x":` + deep + `}`, false},
	} {
		if got := checkScanEvent(t, []byte(c.in)); got != c.fast {
			t.Errorf("scanEvent(%s) took it: %v, want %v", c.in, got, c.fast)
		}
	}
	// The fast path gives DecodeEvent the message the sender encoded.
	m, err := DecodeEvent(sent)
	if err != nil || m.Body != "héllo 😀 <b>" || m.ChatID != 42 || m.Seq != 7 || m.Author != "alice" || !m.SentAt.Equal(at) {
		t.Fatalf("DecodeEvent(%s) = %+v, %v", sent, m, err)
	}
}

func FuzzScanEvent(f *testing.F) {
	f.Add([]byte(`{"id":"0b5c6f5e-5d2e-4b8a-9f53-1d2e3f4a5b6c","chat_id":3,"seq":2,"body":"hi","sent_at":"2026-11-30T07:00:00.123456Z","from":"consumers","delivered_at":null}`))
	f.Add([]byte(`{"body":"é","x":[{"y":true}],"deleted":false}`))
	f.Add([]byte(`{"Body":"x","seq":1e1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkScanEvent(t, data)
	})
}

// TestEventKeysFollowEventFields: the scanner's list of eventFields' JSON
// names is the struct's tags, in field order.
func TestEventKeysFollowEventFields(t *testing.T) {
	t.Parallel()
	typ := reflect.TypeFor[eventFields]()
	if typ.NumField() != len(eventKeys) {
		t.Fatalf("eventFields has %d fields, eventKeys %d names", typ.NumField(), len(eventKeys))
	}
	for i := range typ.NumField() {
		if tag := typ.Field(i).Tag.Get("json"); tag != eventKeys[i] {
			t.Errorf("field %s has tag %q, eventKeys[%d] is %q", typ.Field(i).Name, tag, i, eventKeys[i])
		}
	}
}

// A client frame with an unpaired UTF-16 surrogate escape is refused, as
// the HTTP send refuses it, naming the field: encoding/json would turn it
// into U+FFFD, changing the body, or making client_ids that differ only
// there one idempotency key. A surrogate pair is a character like any.
func TestClientFrameRefusesUnpairedSurrogates(t *testing.T) {
	t.Parallel()
	for frame, field := range map[string]string{
		`{"type":"send","client_id":"s1","body":"lone \ud800 surrogate"}`:                                      "body",
		`{"type":"send","client_id":"x\ud800","body":"one"}`:                                                   "client_id",
		`{"type":"send","client_id":"x\udc00","body":"one"}`:                                                   "client_id",
		`{"type":"edit","client_id":"e1","message_id":"0b5c6f5e-5d2e-4b8a-9f53-1d2e3f4a5b6c","body":"\udbff"}`: "body",
	} {
		_, err := DecodeClientFrame([]byte(frame), 0)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != field || !strings.Contains(fe.Msg, "surrogate") {
			t.Errorf("%s: %v, want a surrogate error naming %q", frame, err, field)
		}
	}
	f, err := DecodeClientFrame([]byte(`{"type":"send","client_id":"p\ud83d\ude00","body":"pair \ud83d\ude00"}`), 0)
	if err != nil || f.Body != "pair 😀" || f.ClientID != "p😀" {
		t.Errorf("a surrogate pair: %+v, %v; want the character", f, err)
	}
}

// An idempotency key holds no control character of any range: C0, DEL or
// C1 (U+0080–U+009F), which a header or a log would show as nothing.
func TestClientIDRefusesControlCharacters(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"a\x01", "a\x7f", "\u0085x", "x\u009f"} {
		var fe *FieldError
		if err := ValidateClientID("client_id", key); !errors.As(err, &fe) || fe.Field != "client_id" {
			t.Errorf("key %q: %v, want a client_id error", key, err)
		}
	}
	for _, key := range []string{"k1", "ключ-😀", "a b", "\u00a0x"} {
		if err := ValidateClientID("client_id", key); err != nil {
			t.Errorf("key %q: %v, want it accepted", key, err)
		}
	}
}
