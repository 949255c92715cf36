package chat

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// refDecodeSendRequest is DecodeSendRequest as it was, with encoding/json's
// tokenizer only: the fast path must answer every input as it did.
func refDecodeSendRequest(data []byte, maxBodyBytes int) (SendRequest, error) {
	var req SendRequest
	if !utf8.Valid(data) {
		return req, &FieldError{Field: "body", Msg: "request is not valid UTF-8"}
	}
	malformed := func(why string) error { return &FieldError{Field: "", Msg: "malformed JSON: " + why} }
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil {
		return req, malformed("expected an object")
	} else if d, ok := tok.(json.Delim); !ok || d != '{' {
		return req, malformed("expected an object")
	}
	var body, clientID *string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return req, malformed("bad object key")
		}
		key, _ := tok.(string)
		var dst **string
		switch key {
		case "body":
			dst = &body
		case "client_id":
			dst = &clientID
		default:
			return req, &FieldError{Field: key, Msg: "unknown field (the fields are \"body\" and \"client_id\")"}
		}
		if *dst != nil {
			return req, &FieldError{Field: key, Msg: "given twice"}
		}
		tok, err = dec.Token()
		if err != nil {
			return req, malformed(fmt.Sprintf("bad value of %q", key))
		}
		str, ok := tok.(string)
		if !ok {
			return req, &FieldError{Field: key, Msg: "must be a string"}
		}
		*dst = &str
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return req, malformed("unterminated object")
	}
	if _, err := dec.Token(); err != io.EOF {
		return req, malformed("trailing data after the object")
	}
	if body == nil {
		return req, &FieldError{Field: "body", Msg: "is required"}
	}
	// encoding/json turns an unpaired surrogate escape ("\ud800") into
	// U+FFFD; refuse rather than silently change the text.
	if hasUnpairedSurrogate(data) {
		field := "body"
		if clientID != nil && strings.ContainsRune(*clientID, utf8.RuneError) {
			field = "client_id"
		}
		return req, &FieldError{Field: field, Msg: "contains an unpaired UTF-16 surrogate escape"}
	}
	return validSendRequest(*body, clientID, maxBodyBytes)
}

// checkSendRequest fails t unless DecodeSendRequest answers data as
// refDecodeSendRequest does (the same request, or an equal error).
func checkSendRequest(t *testing.T, data []byte, maxBody int) {
	t.Helper()
	want, wantErr := refDecodeSendRequest(data, maxBody)
	got, err := DecodeSendRequest(data, maxBody)
	if got != want || !reflect.DeepEqual(err, wantErr) {
		t.Fatalf("DecodeSendRequest(%q, %d) = %+v, %v; want %+v, %v", data, maxBody, got, err, want, wantErr)
	}
}

func TestDecodeSendRequestFastPathMatches(t *testing.T) {
	t.Parallel()
	for _, s := range []string{
		`{"body":"hi"}`, ` { "body" : "hi" , "client_id" : "k1" } `, "\t{\r\n\"client_id\":\"k\",\"body\":\"x\"}\n",
		`{"body":"hi","body":"again"}`, `{"client_id":"a","client_id":"b","body":"x"}`, `{"Body":"hi"}`, `{"body":"hi","x":1}`,
		`{"body":"hi",}`, `{"body":"hi"} {}`, `{"body":"hi"}x`, `{"body":"hi"`, `{"body" "hi"}`, `{"body":1}`, `{"body":null}`,
		`{}`, `[]`, ``, ` `, `"body"`, `{"client_id":"k"}`, `{"body":" "}`, `{"body":"a\u0000b"}`, "{\"body\":\"a\x00b\"}",
		"{\"body\":\"tab\there\"}", `{"body":"esc \"q\" \\ \n"}`, `{"body":"\ud800"}`, `{"body":"\ud83d\ude00"}`,
		`{"body":"x","client_id":""}`, `{"body":"x","client_id":"\ud800"}`, "{\"body\":\"x\",\"client_id\":\"a\x7fb\"}",
		`{"body":"` + strings.Repeat("é", 3000) + `"}`, "{\"body\":\"bad \xff\"}", "\xef\xbb\xbf{\"body\":\"bom\"}",
		`{"body":"x","client_id":"` + strings.Repeat("k", 129) + `"}`, `{"body":"x","client_id":"k"}}`, `{{"body":"x"}`,
	} {
		checkSendRequest(t, []byte(s), 0)
		checkSendRequest(t, []byte(s), 5)
	}
}

func FuzzDecodeSendRequestFastPath(f *testing.F) {
	f.Add([]byte(`{"body":"hello","client_id":"c1"}`), 0)
	f.Add([]byte(` {"client_id" : "c1", "body":"h\u00e9llo\n"} `), 3)
	f.Add([]byte(`{"body":"x","body":"y"}`), 0)
	f.Add([]byte(`{"body":"x", "client_id":"y"}  `), 1)
	f.Fuzz(func(t *testing.T, data []byte, maxBody int) {
		checkSendRequest(t, data, maxBody%10000)
	})
}

// BenchmarkDecodeSendRequest decodes a usual send request: a short body
// and a client id.
func BenchmarkDecodeSendRequest(b *testing.B) {
	data := []byte(`{"body":"a message of some forty bytes, <b>bold</b>","client_id":"c-17-0001234"}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeSendRequest(data, 0); err != nil {
			b.Fatal(err)
		}
	}
}
