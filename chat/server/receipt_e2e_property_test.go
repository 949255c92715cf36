package server

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/internal/testenv"
)

// faultySource wraps a worker's stream source: it loses the first copy of
// some messages (acked unread, as if Redis had dropped the entry) and
// fails the first ack of some batches (a crash between the commit and the
// ack: the entries come back after the lock duration, as duplicates).
type faultySource struct {
	inbox.Source
	f *faults
}

type faults struct {
	mu       sync.Mutex
	seen     map[string]bool
	lost     int
	ackFails int
}

func pick(s string, mod uint32) bool {
	h := fnv.New32a()
	h.Write([]byte(s))
	return h.Sum32()%mod == 0
}

func (s *faultySource) Fetch(ctx context.Context, n int) ([]inbox.Delivery, error) {
	ds, err := s.Source.Fetch(ctx, n)
	if err != nil {
		return ds, err
	}
	keep := ds[:0]
	for _, d := range ds {
		s.f.mu.Lock()
		first := !s.f.seen["fetch "+d.ID]
		s.f.seen["fetch "+d.ID] = true
		lose := first && pick(d.ID, 5) // messages and receipts
		if lose {
			s.f.lost++
		}
		s.f.mu.Unlock()
		if lose {
			if err := s.Source.Ack(ctx, d.Ref); err != nil {
				return nil, err
			}
			continue
		}
		keep = append(keep, d)
	}
	return keep, nil
}

func (s *faultySource) Ack(ctx context.Context, refs ...string) error {
	s.f.mu.Lock()
	fail := false
	for _, r := range refs {
		if !s.f.seen["ack "+r] && pick("ack"+r, 6) {
			fail = true
		}
		s.f.seen["ack "+r] = true
	}
	if fail {
		s.f.ackFails++
	}
	s.f.mu.Unlock()
	if fail {
		return errors.New("test: crashed between the commit and the ack")
	}
	return s.Source.Ack(ctx, refs...)
}

// End to end, both services running, the receiving side with two inbox
// consumers (two processes' worker roles, different consumer names) on one
// stream that loses entries and fails acks (and the sender's receipts
// stream losing entries and failing acks too): every message ends up
// delivered (the re-drive heals), every receipt the sender recorded is
// backed by the receiver's inbox (a), no inbox row is wrongly not held
// (d), and the receiver's sockets show each chat's messages once, in order
// (c).
func TestReceiptPropertyEndToEndTwoWorkers(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	f := &faults{seen: map[string]bool{}}
	lossy := func(name string, roles ...string) func(*Config) {
		return func(c *Config) {
			c.LockDuration = time.Second // re-drive after 2 s
			c.Worker.ConsumerName = name
			c.Roles = roles
			c.Hooks = testHooks{source: func(s inbox.Source) inbox.Source { return &faultySource{Source: s, f: f} }}
		}
	}
	cons := h.start(chat.Consumers, lossy("consumers-a"))
	work := h.start(chat.Workers, lossy("workers-a"))
	h.start(chat.Workers, lossy("workers-b", RoleWorker))
	chats := []int64{21, 22, 23}
	const n = 12
	var ws []*chattest.Watcher
	for _, c := range chats {
		ws = append(ws, chattest.Watch(t, work.base, c))
	}
	for i := 1; i <= n; i++ {
		for _, c := range chats {
			chattest.Send(t, cons.base, c, fmt.Sprintf("m%d", i))
		}
	}
	testenv.WaitFor(t, 60*time.Second, "every message delivered", func() bool {
		return h.Count(t, `SELECT count(*) FROM consumers.messages_with_receipts WHERE delivered_at IS NOT NULL`) == n*len(chats)
	})
	if n := h.Count(t, `SELECT count(*) FROM consumers.receipts r
		WHERE (SELECT count(*) FROM workers.inbox i WHERE i.chat_id = r.chat_id AND i.seq <= r.upto_seq) <> r.upto_seq`); n != 0 {
		t.Fatalf("(a) %d receipts the sender recorded claim a seq the receiver's inbox lacks", n)
	}
	if n := h.Count(t, `SELECT count(*) FROM workers.inbox i WHERE NOT i.held
		AND (SELECT count(*) FROM workers.inbox j WHERE j.chat_id = i.chat_id AND j.seq <= i.seq) <> i.seq`); n != 0 {
		t.Fatalf("(d) %d inbox rows not held with a lower seq missing", n)
	}
	for i, w := range ws {
		t.Logf("chat %d", chats[i])
		w.WaitSeqs(t, chat.Consumers, n, 20*time.Second)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lost == 0 || f.ackFails == 0 {
		t.Fatalf("faults injected: %d entries lost, %d acks failed; want some of each", f.lost, f.ackFails)
	}
	t.Logf("%d entries lost, %d acks failed", f.lost, f.ackFails)
}
