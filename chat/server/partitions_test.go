package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/internal/testenv"
)

// laneLog records, per inbox source (one per partition stream of a worker
// role), the chats of the deliveries it fetched and, per chat, the seqs of
// the messages in fetch order (first copies only).
type laneLog struct {
	mu    sync.Mutex
	lanes []*laneSource
}

type laneSource struct {
	inbox.Source
	log   *laneLog
	chats map[int64]bool
	seqs  map[int64][]int64
	seen  map[string]bool
}

func (l *laneLog) wrap(s inbox.Source) inbox.Source {
	ls := &laneSource{Source: s, log: l, chats: map[int64]bool{}, seqs: map[int64][]int64{}, seen: map[string]bool{}}
	l.mu.Lock()
	l.lanes = append(l.lanes, ls)
	l.mu.Unlock()
	return ls
}

func (s *laneSource) Fetch(ctx context.Context, n int) ([]inbox.Delivery, error) {
	ds, err := s.Source.Fetch(ctx, n)
	s.log.mu.Lock()
	defer s.log.mu.Unlock()
	for _, d := range ds {
		var ev struct {
			ChatID int64 `json:"chat_id"`
			Seq    int64 `json:"seq"`
			Chats  []struct {
				ChatID int64 `json:"chat_id"`
			} `json:"chats"`
		}
		if json.Unmarshal(d.Payload, &ev) != nil {
			continue
		}
		if ev.ChatID != 0 {
			s.chats[ev.ChatID] = true
		}
		for _, c := range ev.Chats {
			s.chats[c.ChatID] = true
		}
		if d.Name == chat.EventMessageCreated && !s.seen[d.ID] {
			s.seen[d.ID] = true
			s.seqs[ev.ChatID] = append(s.seqs[ev.ChatID], ev.Seq)
		}
	}
	return ds, err
}

// check fails t unless every lane carried the chats of one partition of n
// only, the lanes of a service's worker cover distinct partitions, and
// each chat's messages were fetched in seq order.
func (l *laneLog) check(t *testing.T, n int) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.lanes) != n {
		t.Fatalf("%d inbox sources, want one per partition (%d)", len(l.lanes), n)
	}
	used := map[int]bool{}
	for i, ls := range l.lanes {
		part := -1
		for c := range ls.chats {
			p := chat.Partition(c, n)
			if part >= 0 && p != part {
				t.Fatalf("lane %d carried chats of partitions %d and %d", i, part, p)
			}
			part = p
		}
		if part < 0 {
			t.Fatalf("lane %d carried nothing", i)
		}
		if used[part] {
			t.Fatalf("two lanes carried partition %d", part)
		}
		used[part] = true
		for c, seqs := range ls.seqs {
			for j, s := range seqs {
				if s != int64(j+1) {
					t.Fatalf("lane %d fetched chat %d's messages out of order: %v", i, c, seqs)
				}
			}
		}
	}
}

// post sends body to chatID on base; it returns an error instead of
// failing the test (it runs in goroutines of its own).
func post(base string, chatID int64, body string) error {
	b, _ := json.Marshal(map[string]string{"body": body})
	code, raw, err := chattest.Answer(chattest.AuthClient.Post(fmt.Sprintf("%s/api/chats/%d/messages", base, chatID),
		"application/json", bytes.NewReader(b)))
	if err != nil {
		return err
	}
	if code != http.StatusCreated {
		return fmt.Errorf("send to chat %d: status %d: %s", chatID, code, raw)
	}
	return nil
}

// With 4 partitions, many chats and concurrent senders on both sides, in a
// random interleaving (seed logged): every message is shown once, in seq
// order, on the other side's sockets; each partition's stream carried its
// own chats only, each chat's messages in seq order; no inbox ever saw a
// gap (nothing overtook anything in its lane); every outbox is empty.
func TestPartitionedOrderProperty(t *testing.T) {
	t.Parallel()
	const parts, perChat = 4, 6
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	nChats := 16 + rng.IntN(9) // 16–24 chats, all partitions
	var chats []int64
	for picked := map[int64]bool{}; len(chats) < nChats; {
		if c := int64(1000 + rng.IntN(1_000_000)); !picked[c] {
			picked[c] = true
			chats = append(chats, c)
		}
	}
	h := newHarness(t, "")
	lanes := map[string]*laneLog{chat.Consumers: {}, chat.Workers: {}}
	cfg := func(svc string) func(*Config) {
		return func(c *Config) {
			c.Partitions = parts
			c.Relay.LeaseTTL = time.Second
			c.Hooks = testHooks{source: lanes[svc].wrap}
		}
	}
	run := map[string]*running{
		chat.Consumers: h.start(chat.Consumers, cfg(chat.Consumers)),
		chat.Workers:   h.start(chat.Workers, cfg(chat.Workers)),
	}
	watch := map[string][]*chattest.Watcher{}
	for _, svc := range []string{chat.Consumers, chat.Workers} {
		for _, c := range chats {
			watch[svc] = append(watch[svc], chattest.Watch(t, run[svc].base, c))
		}
	}
	// Each sender goroutine owns a shuffled list of (chat, side) sends; a
	// chat's sends on one side come from one goroutine, so its bodies go
	// out in order, but the goroutines interleave freely.
	type send struct {
		svc  string
		chat int64
	}
	const senders = 8
	work := make([][]send, senders)
	for i, c := range chats {
		for _, svc := range []string{chat.Consumers, chat.Workers} {
			g := (i*2 + len(svc)) % senders
			for range perChat {
				work[g] = append(work[g], send{svc, c})
			}
		}
	}
	for _, w := range work {
		rng.Shuffle(len(w), func(i, j int) { w[i], w[j] = w[j], w[i] })
	}
	errs := make(chan error, senders)
	var wg sync.WaitGroup
	for _, w := range work {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, s := range w {
				if err := post(run[s.svc].base, s.chat, fmt.Sprintf("%s %d", s.svc, s.chat)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for svc, ws := range watch {
		for _, w := range ws {
			// Each socket shows the other side's messages once, in order.
			w.WaitSeqs(t, chat.Peer(svc), perChat, 60*time.Second)
		}
	}
	for _, svc := range []string{chat.Consumers, chat.Workers} {
		lanes[svc].check(t, parts)
		if n := h.Count(t, `SELECT count(*) FROM `+svc+`.inbox_gap_fills`); n != 0 {
			t.Fatalf("%s: %d gaps filled: a message overtook an earlier one of its chat", svc, n)
		}
		testenv.WaitFor(t, 30*time.Second, svc+" outboxes empty", func() bool {
			n := 0
			for p := range parts {
				n += h.Count(t, `SELECT count(*) FROM `+chat.OutboxTable(svc, p))
			}
			return n == 0
		})
	}
}
