package probe

import (
	"strconv"
	"strings"
	"testing"

	"github.com/outboxchat/outboxchat/chat"
)

// TestStreamTapOrder: the stream tap allows a re-sent seq and flags a new
// seq below the highest of its chat.
func TestStreamTapOrder(t *testing.T) {
	tap := &Tap{seen: map[string]map[int64]map[int64]bool{chat.Consumers: {}}, top: map[string]map[int64]int64{chat.Consumers: {}}}
	entry := func(chatID, seq int64) {
		tap.entry(lane{chat.Consumers, streamOf(chat.Consumers)}, "1-0", chat.EventMessageCreated,
			`{"chat_id":`+strconv.FormatInt(chatID, 10)+`,"seq":`+strconv.FormatInt(seq, 10)+`}`)
	}
	entry(1, 1)
	entry(1, 2)
	entry(2, 1)
	entry(1, 1) // a re-send (relay crash, re-drive): allowed
	entry(1, 3)
	tap.entry(lane{chat.Consumers, streamOf(chat.Consumers)}, "1-1", chat.EventMessageCreated, "{not an event")
	if v := tap.Violations(); len(v) != 0 {
		t.Fatalf("in-order entries flagged: %v", v)
	}
	entry(1, 5)
	entry(1, 4) // published after 5: out of order
	if v := tap.Violations(); len(v) != 1 || !strings.Contains(v[0], "chat 1 seq 4 added after seq 5") {
		t.Fatalf("want seq 4 after 5 flagged, got %v", v)
	}
}
