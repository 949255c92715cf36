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
