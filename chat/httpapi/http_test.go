package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/outboxchat/outboxchat/chat"
)

// TestSendErrorBodiesAreGeneric: no 5xx body carries the cause's text.
func TestSendErrorBodiesAreGeneric(t *testing.T) {
	cause := errors.New(`send: begin: error preprocessing batch (prepare): timeout: SQLSTATE 57014 "consumers"."messages"`)
	for _, err := range []error{cause, fmt.Errorf("%w: %w", chat.ErrChatBusy, cause), fmt.Errorf("%w: %w", chat.ErrSendTimeout, cause)} {
		code, body := sendError(err, "client_id")
		if code != http.StatusServiceUnavailable || strings.Contains(body.Error, "SQLSTATE") || strings.Contains(body.Error, "prepar") ||
			strings.Contains(body.Error, "consumers") {
			t.Errorf("%v → %d %+v", err, code, body)
		}
	}
}

// A send whose outcome is unknown says the message may be stored (a 503
// otherwise says nothing was), and how to know: a retry with the key.
func TestSendOutcomeUnknownSaysMayBeStored(t *testing.T) {
	err := fmt.Errorf("send: %w: insert and commit: unexpected EOF", chat.ErrSendOutcomeUnknown)
	code, body := sendError(err, "client_id")
	if code != http.StatusServiceUnavailable || !strings.Contains(body.Error, "may be stored") || !strings.Contains(body.Error, "same idempotency key") ||
		strings.Contains(body.Error, "EOF") {
		t.Errorf("%v → %d %+v, want 503 saying it may be stored and to retry with the same key, without the cause", err, code, body)
	}
	if _, plain := sendError(errors.New("send: acquire connection: refused"), "client_id"); strings.Contains(plain.Error, "may be stored") {
		t.Errorf("a plain failure's body %q says the message may be stored", plain.Error)
	}
}
