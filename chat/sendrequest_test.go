package chat

import (
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// refDecodeSendRequest is DecodeSendRequest as it was, with encoding/json's
// tokenizer only (its slow path alone): the fast path must answer every
// input as it did.
func refDecodeSendRequest(data []byte, maxBodyBytes int) (SendRequest, error) {
	if !utf8.Valid(data) {
		return SendRequest{}, &FieldError{Field: "body", Msg: "request is not valid UTF-8"}
	}
	body, clientID, err := decodeSendRequestSlow(data)
	if err != nil {
		return SendRequest{}, err
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
