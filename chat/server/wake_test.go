package server

import (
	"fmt"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/internal/testenv"
)

// Another process of each service, API only, whose gateway polls once an
// hour: its clients still get the messages and receipts that the worker
// process's inbox stored, which only the wake-up sent after each inbox
// commit (outside the inbox transaction) can bring that fast.
func TestInboxWakeUpReachesAnotherProcessGateway(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	hourPoll := func(c *Config) { c.gatewayPoll = time.Hour }
	cons := h.start(chat.Consumers, hourPoll)
	h.start(chat.Workers, hourPoll)
	otherWork := h.startAPI(chat.Workers, hourPoll)
	otherCons := h.startAPI(chat.Consumers, hourPoll)
	w := chattest.Watch(t, otherWork.base, 31)
	c := chattest.Watch(t, otherCons.base, 31)
	for i := 1; i <= 3; i++ {
		chattest.Send(t, cons.base, 31, fmt.Sprint("m", i))
		w.WaitSeqs(t, chat.Consumers, i, 15*time.Second)
	}
	testenv.WaitFor(t, 15*time.Second, "a receipt frame up to seq 3 at the other consumers process", func() bool {
		return c.LastReceipt(chat.Consumers).UptoSeq == 3
	})
}
