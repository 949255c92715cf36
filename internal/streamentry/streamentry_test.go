package streamentry_test

import (
	"errors"
	"maps"
	"testing"

	"github.com/outboxchat/outboxchat/internal/streamentry"
	"github.com/outboxchat/outboxchat/outbox"
)

// FuzzDecodeHeaders: the headers field is outside input. Whatever it
// holds, decoding never panics; a field that decodes is within the limits
// and encodes back to an equal map.
func FuzzDecodeHeaders(f *testing.F) {
	f.Add(`{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}`)
	f.Add(`{"a":"b","c":""}`)
	f.Add(`{"a":1}`)
	f.Add(`{"":"x"}`)
	f.Add(`{"k":"\u0000"}`)
	f.Add(`null`)
	f.Add(`{}`)
	f.Add(``)
	f.Fuzz(func(t *testing.T, s string) {
		h, err := streamentry.DecodeHeaders(s)
		if err != nil {
			if !errors.Is(err, streamentry.ErrBadHeaders) {
				t.Fatalf("error %v does not wrap streamentry.ErrBadHeaders", err)
			}
			return
		}
		if err := outbox.CheckHeaders(h); err != nil {
			t.Fatalf("decoded %q beyond the limits: %v", s, err)
		}
		back, err := streamentry.DecodeHeaders(streamentry.EncodeHeaders(h))
		if err != nil || !maps.Equal(back, h) {
			t.Fatalf("round trip of %v: %v, %v", h, back, err)
		}
	})
}

// What Values writes, Decode reads back: the fields of a job, sig and
// headers only when set.
func TestValuesDecodeRoundTrip(t *testing.T) {
	t.Parallel()
	for _, f := range []streamentry.Fields{
		{ID: "a", Name: "n", Payload: []byte("p")},
		{ID: "b", Name: "m", Payload: []byte{}, Sig: "v1=x", Headers: map[string]string{"trace": "t"}},
	} {
		vals := streamentry.Values(f)
		m := map[string]any{}
		for i := 0; i < len(vals); i += 2 {
			v := vals[i+1]
			if b, ok := v.([]byte); ok {
				v = string(b) // as go-redis reads a field back
			}
			m[vals[i].(string)] = v
		}
		if _, ok := m[streamentry.SigField]; ok != (f.Sig != "") {
			t.Errorf("%s: sig field present %v", f.ID, ok)
		}
		got, err := streamentry.Decode("1-0", m)
		if err != nil || got.ID != f.ID || got.Name != f.Name || string(got.Payload) != string(f.Payload) ||
			got.Sig != f.Sig || !maps.Equal(got.Headers, f.Headers) {
			t.Errorf("round trip of %+v: %+v, %v", f, got, err)
		}
	}
	if _, err := streamentry.Decode("2-0", map[string]any{"name": "n"}); !errors.Is(err, streamentry.ErrMalformed) {
		t.Errorf("entry without id and payload: %v, want ErrMalformed", err)
	}
}
