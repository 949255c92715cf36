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
