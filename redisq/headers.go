package redisq

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/outboxchat/outboxchat/outbox"
)

// headersField is the stream entry field that carries Job.Headers, as a
// JSON object of strings ({"traceparent":"00-…"}). An entry without
// headers has no such field, so entries written before headers existed
// read as before.
const headersField = "headers"

// encodeHeaders returns h as the headers field's value: a JSON object with
// its keys sorted (encoding/json sorts map keys), or "" for no headers.
func encodeHeaders(h map[string]string) string {
	if len(h) == 0 {
		return ""
	}
	b, err := json.Marshal(h) // a map of strings always encodes
	if err != nil {
		return ""
	}
	return string(b)
}

// errBadHeaders is wrapped by decodeHeaders' errors.
var errBadHeaders = errors.New("headers field")

// decodeHeaders parses a headers field written by encodeHeaders: a JSON
// object whose values are strings, within the limits of
// outbox.CheckHeaders. "" decodes to nil. The input is outside data
// (anything that can XADD to the stream wrote it): errors wrap
// errBadHeaders and, for a limit, outbox.ErrInvalidHeaders; they never
// panic.
func decodeHeaders(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	// Cheap bound before parsing: what the limits allow, JSON-escaped
	// (at most 6 bytes per byte for \u00XX), plus the punctuation.
	if len(s) > outbox.MaxHeaders*(6*(outbox.MaxHeaderKeyBytes+outbox.MaxHeaderValueBytes)+6)+2 {
		return nil, fmt.Errorf("%w: %d bytes: %w", errBadHeaders, len(s), outbox.ErrInvalidHeaders)
	}
	var h map[string]string
	if err := json.Unmarshal([]byte(s), &h); err != nil {
		return nil, fmt.Errorf("%w: not a JSON object of strings: %v", errBadHeaders, err)
	}
	if h == nil { // "null"
		return nil, fmt.Errorf("%w: not a JSON object of strings: null", errBadHeaders)
	}
	if err := outbox.CheckHeaders(h); err != nil {
		return nil, fmt.Errorf("%w: %w", errBadHeaders, err)
	}
	if len(h) == 0 {
		return nil, nil
	}
	return h, nil
}
