package outbox

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Limits of an event's headers (Event.Headers). They keep the headers small
// enough to ride on every row, stream entry and inbox delivery without
// changing their cost: a W3C traceparent (55 bytes) and tracestate (at most
// 512 bytes) fit, a document does not.
const (
	// MaxHeaders is the most headers one event may carry.
	MaxHeaders = 16
	// MaxHeaderKeyBytes is the longest header key, in bytes.
	MaxHeaderKeyBytes = 64
	// MaxHeaderValueBytes is the longest header value, in bytes.
	MaxHeaderValueBytes = 1024
)

// ErrInvalidHeaders is wrapped (together with ErrInvalidEvent, for Enqueue)
// by every error about headers that break the limits: more than MaxHeaders,
// a key that is empty, longer than MaxHeaderKeyBytes or holds a byte other
// than an ASCII letter, digit, '-', '_' or '.', a value longer than
// MaxHeaderValueBytes, not valid UTF-8 or holding a NUL (jsonb cannot store
// one).
var ErrInvalidHeaders = errors.New("invalid headers")

// CheckHeaders returns nil when h is within the headers' limits (nil and
// empty maps are), else an error wrapping ErrInvalidHeaders that names the
// offending key. It is what Writer.Enqueue checks, and what a receiver
// (redisq's decoder) checks again on what it reads. Safe for concurrent
// use; it does not modify h.
func CheckHeaders(h map[string]string) error {
	if len(h) > MaxHeaders {
		return fmt.Errorf("%d headers, at most %d: %w", len(h), MaxHeaders, ErrInvalidHeaders)
	}
	for k, v := range h {
		if err := checkHeaderKey(k); err != nil {
			return err
		}
		switch {
		case len(v) > MaxHeaderValueBytes:
			return fmt.Errorf("header %q: value of %d bytes, at most %d: %w", k, len(v), MaxHeaderValueBytes, ErrInvalidHeaders)
		case !utf8.ValidString(v):
			return fmt.Errorf("header %q: value is not valid UTF-8: %w", k, ErrInvalidHeaders)
		case strings.IndexByte(v, 0) >= 0:
			return fmt.Errorf("header %q: value holds a NUL byte: %w", k, ErrInvalidHeaders)
		}
	}
	return nil
}

// checkHeaderKey checks one key: 1 to MaxHeaderKeyBytes bytes of
// [A-Za-z0-9._-].
func checkHeaderKey(k string) error {
	if k == "" || len(k) > MaxHeaderKeyBytes {
		return fmt.Errorf("header key %.70q: want 1 to %d bytes: %w", k, MaxHeaderKeyBytes, ErrInvalidHeaders)
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("header key %q: byte %q is not a letter, digit, '-', '_' or '.': %w", k, c, ErrInvalidHeaders)
		}
	}
	return nil
}
