package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/chat/status"
	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/redisq"
)

// laneLog records, per inbox source (one per partition stream of a worker
// role), the chats of the deliveries other than receipts it fetched and, per chat, the seqs of
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
		// A receipt is cumulative per chat and applies in any order: the
		// receipt of a shared inbox transaction covers the chats of every
		// partition it merged and travels in the first one's lane.
		if d.Name != chat.EventReceipt {
			for _, c := range ev.Chats {
				s.chats[c.ChatID] = true
			}
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
	nChats := 16 + rng.IntN(9) // 16–24 chats
	var chats []int64
	perPart := make([]int, parts)
	// Random chats, and more until every partition has two: 16 chats miss
	// a partition about one time in 25.
	for picked := map[int64]bool{}; len(chats) < nChats || slices.Min(perPart) < 2; {
		if c := int64(1000 + rng.IntN(1_000_000)); !picked[c] {
			picked[c] = true
			chats = append(chats, c)
			perPart[chat.Partition(c, parts)]++
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
	chattest.Concurrently(t, senders, func(i int) error {
		for _, s := range work[i] {
			if err := post(run[s.svc].base, s.chat, fmt.Sprintf("%s %d", s.svc, s.chat)); err != nil {
				return err
			}
		}
		return nil
	})
	for svc, ws := range watch {
		for _, w := range ws {
			// Each socket shows the other side's messages once, in order.
			w.WaitSeqs(t, chat.Peer(svc), perChat, 60*time.Second)
		}
	}
	for _, svc := range []string{chat.Consumers, chat.Workers} {
		// The partitions' relay passes and inbox batches went through the
		// process's groups.
		for _, name := range []string{"outboxchat_relay_shared_transactions_total", "outboxchat_inbox_shared_transactions_total"} {
			if v := scrape(t, run[svc].base, name); v < 1 {
				t.Fatalf("%s: %s = %v, want at least 1", svc, name, v)
			}
		}
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
	// Status covers every partition, and says when both sides are
	// drained.
	testenv.WaitFor(t, 30*time.Second, "status: both services drained", func() bool {
		st, err := status.ReadStatus(context.Background(), h.Admin, testenv.Redis(t), nil, h.Prefix, status.StatusThresholds{}, status.CommandFlags{})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range st.Services {
			if len(s.Partitions) != parts {
				t.Fatalf("%s: status lists %d partitions, want %d", s.Service, len(s.Partitions), parts)
			}
			for _, p := range s.Partitions {
				if p.LeaseOwner == "" || p.Stream != redisq.NewKeys(h.Prefix, chat.PartitionQueue(chat.Peer(s.Service), p.Partition)).Stream {
					t.Fatalf("%s partition %d: %+v", s.Service, p.Partition, p)
				}
			}
			if !s.Drained {
				return false
			}
		}
		return true
	})
}

// leaseOwners returns, per live owner of service's partition leases (the
// consumer name before the owner's random suffix), how many it holds.
func leaseOwners(t *testing.T, h *harness, service string) map[string]int {
	t.Helper()
	out := map[string]int{}
	if err := h.Admin.QueryRow(context.Background(), `SELECT coalesce(jsonb_object_agg(o, n), '{}') FROM (
		SELECT split_part(owner, '#', 1) AS o, count(*) AS n FROM `+service+`.partition_leases
		WHERE owner IS NOT NULL AND expires_at > now() GROUP BY 1) l`).Scan(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

// Two relay processes of consumers share its 4 partitions by leases: one
// alone holds all 4; a second one joining gets 2 (rebalance); when it
// stops gracefully, or is killed without releasing anything, the first
// takes its partitions back within the lease TTL + 1 s; messages sent all
// along (to chats of every partition) are shown once each, in order.
func TestPartitionLeaseHandOver(t *testing.T) {
	t.Parallel()
	const parts = 4
	const ttl = time.Second
	h := newHarness(t, "")
	relay := func(name string, kill chan struct{}) func(*Config) {
		return func(c *Config) {
			c.Partitions = parts
			c.Relay.LeaseTTL = ttl
			c.Roles = []string{RoleRelay}
			c.Worker.ConsumerName = name
			c.kill = kill
		}
	}
	api := h.start(chat.Consumers, func(c *Config) {
		c.Partitions = parts
		c.Roles = []string{RoleAPI}
	})
	work := h.start(chat.Workers, func(c *Config) { c.Partitions = parts; c.Relay.LeaseTTL = ttl })
	chats := []int64{40, 41, 42, 43, 44, 45, 46, 47} // two per partition
	var ws []*chattest.Watcher
	for _, c := range chats {
		ws = append(ws, chattest.Watch(t, work.base, c))
	}
	sent := 0
	sendRound := func() {
		t.Helper()
		for _, c := range chats {
			chattest.Send(t, api.base, c, fmt.Sprint("round ", sent+1))
		}
		sent++
	}
	shown := func(what string) {
		t.Helper()
		for _, w := range ws {
			w.WaitSeqs(t, chat.Consumers, sent, 30*time.Second)
		}
		t.Logf("%s: %d rounds shown", what, sent)
	}
	owners := func(what string, d time.Duration, want map[string]int) {
		t.Helper()
		began := time.Now()
		defer func() { t.Logf("%s: after %v", what, time.Since(began).Round(time.Millisecond)) }()
		testenv.WaitFor(t, d, what, func() bool {
			got := leaseOwners(t, h, chat.Consumers)
			if len(got) != len(want) {
				return false
			}
			for o, n := range want {
				if got[o] != n {
					return false
				}
			}
			return true
		})
	}

	h.start(chat.Consumers, relay("relay-a", nil))
	owners("relay-a holds all partitions", 10*time.Second, map[string]int{"relay-a": parts})
	sendRound()
	shown("relay-a alone")

	b := h.start(chat.Consumers, relay("relay-b", nil))
	owners("rebalanced to 2 and 2", 10*time.Second, map[string]int{"relay-a": 2, "relay-b": 2})
	sendRound()
	shown("relay-a and relay-b")

	b.stop() // graceful: releases
	owners("relay-a takes relay-b's released partitions", ttl+time.Second, map[string]int{"relay-a": parts})
	sendRound()
	shown("after the graceful stop")

	kill := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(kill) }) })
	h.start(chat.Consumers, relay("relay-b", kill))
	owners("rebalanced again", 10*time.Second, map[string]int{"relay-a": 2, "relay-b": 2})
	sendRound()
	shown("relay-b back")

	// Sends while relay-b dies: the ones in its partitions wait in the
	// outbox until relay-a takes them over.
	once.Do(func() { close(kill) })
	killed := time.Now()
	sendRound()
	owners("relay-a takes relay-b's expired partitions", ttl+time.Second, map[string]int{"relay-a": parts})
	t.Logf("relay failover: all partitions held by relay-a %v after relay-b's kill (lease TTL %v)", time.Since(killed).Round(time.Millisecond), ttl)
	sendRound()
	shown("after the kill")
	// A row relay-b published before it died, without deleting it, is
	// shown already and waits for relay-a's next pass of its partition,
	// which publishes it again (a no-op) and deletes it.
	testenv.WaitFor(t, 10*time.Second, "every partition's outbox empty", func() bool {
		for p := range parts {
			if h.Count(t, `SELECT count(*) FROM `+chat.OutboxTable(chat.Consumers, p)) != 0 {
				return false
			}
		}
		return true
	})
}

// Partitions and their leases through a real PgBouncer in transaction
// mode (leases are rows, not session locks): both services with 3
// partitions, every partition's lease held, messages of chats of every
// partition arrive once, in order, both ways.
func TestPartitionsThroughPgBouncer(t *testing.T) {
	t.Parallel()
	const parts = 3
	h := newHarness(t, "")
	viaPooler := func(service string) func(*Config) {
		return func(c *Config) {
			c.DatabaseURL, c.ListenDatabaseURL = h.pooled(service), h.RoleURL(service)
			c.Partitions = parts
			c.Relay.LeaseTTL = time.Second
		}
	}
	cons := h.start(chat.Consumers, viaPooler(chat.Consumers))
	work := h.start(chat.Workers, viaPooler(chat.Workers))
	for _, svc := range []string{chat.Consumers, chat.Workers} {
		testenv.WaitFor(t, 10*time.Second, svc+" holds every lease", func() bool {
			n := 0
			for _, k := range leaseOwners(t, h, svc) {
				n += k
			}
			return n == parts
		})
	}
	for c := int64(60); c < 60+parts; c++ {
		for _, dir := range [][2]*running{{cons, work}, {work, cons}} {
			from, to := dir[0], dir[1]
			svc := map[*running]string{cons: chat.Consumers, work: chat.Workers}[from]
			w := chattest.Watch(t, to.base, c)
			for i := 1; i <= 3; i++ {
				chattest.Send(t, from.base, c, fmt.Sprint("via ", svc, " ", i))
				w.WaitSeqs(t, svc, i, 10*time.Second)
			}
		}
	}
}

// On a Redis Cluster of three masters, each service as its
// least-privilege user for 4 partitions (schema.RedisACLPartitions):
// messages of a chat of every partition flow both ways, each partition's
// queue keys share one slot, and the partitions' streams do not all sit
// on one master.
func TestPartitionsOnRedisCluster(t *testing.T) {
	t.Parallel()
	const parts = 4
	cl, h, urls := clusterUsers(t, parts)
	run := map[string]*running{}
	for _, svc := range []string{chat.Consumers, chat.Workers} {
		url := urls[svc]
		run[svc] = h.start(svc, func(c *Config) {
			c.RedisURL, c.Partitions, c.Relay.LeaseTTL = url, parts, time.Second
		})
	}
	for c := int64(30); c < 30+parts; c++ {
		wc, ww := chattest.Watch(t, run[chat.Consumers].base, c), chattest.Watch(t, run[chat.Workers].base, c)
		for range 3 {
			chattest.Send(t, run[chat.Consumers].base, c, "to workers")
			chattest.Send(t, run[chat.Workers].base, c, "to consumers")
		}
		ww.WaitSeqs(t, chat.Consumers, 3, 20*time.Second)
		wc.WaitSeqs(t, chat.Workers, 3, 20*time.Second)
	}
	masters := map[string]bool{}
	for _, svc := range []string{chat.Consumers, chat.Workers} {
		for p := range parts {
			k := redisq.NewKeys(h.Prefix, chat.PartitionQueue(svc, p))
			masters[inStreamSlot(t, cl, k, k.Dead, k.Dedupe, k.DedupeTokens)] = true
		}
	}
	if len(masters) < 2 {
		t.Fatalf("the %d partition streams all sit on one master", 2*parts)
	}
	// On a cluster the relays keep their own passes (one master's trouble
	// holds back only its lanes); the inbox batches are still shared.
	m, err := chattest.Get(run[chat.Consumers].base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(m, "outboxchat_relay_shared_transactions_total") || !strings.Contains(m, "outboxchat_inbox_shared_transactions_total") {
		t.Fatal("on a Redis Cluster: want no shared relay passes and shared inbox transactions")
	}
}
