package gateway

import (
	"fmt"
	"strings"
	"time"
)

// parseReceiptNote parses a ReceiptChannel payload; malformed items are
// skipped.
func parseReceiptNote(payload string) []receiptNote {
	var out []receiptNote
	for _, item := range strings.Split(payload, ",") {
		var n receiptNote
		var us int64
		if _, err := fmt.Sscanf(item, "%d:%d:%d", &n.chatID, &n.upto, &us); err != nil {
			continue
		}
		n.at = time.UnixMicro(us)
		out = append(out, n)
	}
	return out
}

// receiptNote is one applied receipt as the gateway handles it.
type receiptNote struct {
	chatID, upto int64
	at           time.Time
}
