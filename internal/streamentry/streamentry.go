// Package streamentry is the layout of a job in a Redis stream entry: its
// fields (id, name, payload, and sig and headers when set), the JSON
// encoding of its headers, and the decoding of an entry read back, which
// treats every field as outside data.
package streamentry

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/outboxchat/outboxchat/outbox"
)

// Field names of an entry. HeadersField carries the headers as a JSON
// object of strings ({"traceparent":"00-…"}); an entry without headers has
// no such field, so entries written before headers existed read as
// before. SigField is absent on unsigned entries.
const (
	IDField      = "id"
	NameField    = "name"
	PayloadField = "payload"
	SigField     = "sig"
	HeadersField = "headers"
)

// Fields are one job's fields, in the order and with the types of
// redisq.Job, so that either converts to the other.
type Fields struct {
	ID      string
	Name    string
	Payload []byte
	Sig     string
	Headers map[string]string
}

// ErrMalformed is wrapped by Decode's error for an entry that lacks the
// id, name or payload field, or whose headers field does not decode.
var ErrMalformed = errors.New("redisq: malformed stream entry")

// ErrBadHeaders is wrapped by DecodeHeaders' errors.
var ErrBadHeaders = errors.New("headers field")

// Values returns f as XADD's field-value list: id, name, payload, then sig
// and headers when not empty. Headers must be within the limits of
// outbox.CheckHeaders (not checked here).
func Values(f Fields) []any {
	vals := []any{IDField, f.ID, NameField, f.Name, PayloadField, f.Payload}
	if f.Sig != "" {
		vals = append(vals, SigField, f.Sig)
	}
	if h := EncodeHeaders(f.Headers); h != "" {
		vals = append(vals, HeadersField, h)
	}
	return vals
}

// Decode reads the fields of the entry streamID from values (as go-redis
// returns them). It returns every field it could read; the error, wrapping
// ErrMalformed and naming streamID, says what was missing, empty (the id),
// not a string, or an undecodable headers field (then Headers is nil).
func Decode(streamID string, values map[string]any) (Fields, error) {
	var f Fields
	var missing []string
	field := func(name string) (string, bool) {
		s, ok := values[name].(string)
		if !ok {
			missing = append(missing, name)
		}
		return s, ok
	}
	f.ID, _ = field(IDField)
	f.Name, _ = field(NameField)
	if p, ok := field(PayloadField); ok {
		f.Payload = []byte(p)
	}
	f.Sig, _ = values[SigField].(string)
	var badHeaders error
	if v, ok := values[HeadersField]; ok {
		if s, ok := v.(string); ok {
			f.Headers, badHeaders = DecodeHeaders(s)
		} else {
			badHeaders = fmt.Errorf("%w: not a string", ErrBadHeaders)
		}
	}
	if f.ID == "" && len(missing) == 0 {
		missing = append(missing, IDField)
	}
	switch {
	case len(missing) > 0:
		return f, fmt.Errorf("%w %s: missing or empty fields %v", ErrMalformed, streamID, missing)
	case badHeaders != nil:
		return f, fmt.Errorf("%w %s: %w", ErrMalformed, streamID, badHeaders)
	}
	return f, nil
}

// EncodeHeaders returns h as the headers field's value: a JSON object with
// its keys sorted (encoding/json sorts map keys), or "" for no headers.
func EncodeHeaders(h map[string]string) string {
	if len(h) == 0 {
		return ""
	}
	b, err := json.Marshal(h) // a map of strings always encodes
	if err != nil {
		return ""
	}
	return string(b)
}

// DecodeHeaders parses a headers field written by EncodeHeaders: a JSON
// object whose values are strings, within the limits of
// outbox.CheckHeaders. "" decodes to nil. The input is outside data
// (anything that can XADD to the stream wrote it): errors wrap
// ErrBadHeaders and, for a limit, outbox.ErrInvalidHeaders; it never
// panics.
func DecodeHeaders(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	// Cheap bound before parsing: what the limits allow, JSON-escaped
	// (at most 6 bytes per byte for \u00XX), plus the punctuation.
	if len(s) > outbox.MaxHeaders*(6*(outbox.MaxHeaderKeyBytes+outbox.MaxHeaderValueBytes)+6)+2 {
		return nil, fmt.Errorf("%w: %d bytes: %w", ErrBadHeaders, len(s), outbox.ErrInvalidHeaders)
	}
	var h map[string]string
	if err := json.Unmarshal([]byte(s), &h); err != nil {
		return nil, fmt.Errorf("%w: not a JSON object of strings: %v", ErrBadHeaders, err)
	}
	if h == nil { // "null"
		return nil, fmt.Errorf("%w: not a JSON object of strings: null", ErrBadHeaders)
	}
	if err := outbox.CheckHeaders(h); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadHeaders, err)
	}
	if len(h) == 0 {
		return nil, nil
	}
	return h, nil
}
