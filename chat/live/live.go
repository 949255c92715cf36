// Package live carries a chat's ephemeral signals between the WebSocket
// clients of both services: typing indicators and presence (who has the
// chat open). They are at-most-once and never stored: no outbox, no table,
// nothing replayed. Every process of either service publishes on one Redis
// Pub/Sub channel (<prefix>live) and subscribes to it; a signal published
// while Redis is down, or while a process is not subscribed, is lost, and
// that is the contract.
//
// Presence is soft state: each process republishes the users it serves,
// per chat, every Heartbeat, and a process's entries expire TTL after its
// last word, so the users of a process that died vanish within TTL (6 s by
// default); a client that closes its socket leaves at once, one whose
// connection died when the WebSocket ping fails.
package live

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/internal/service"
)

// Defaults of Config.
const (
	DefaultHeartbeat   = 2 * time.Second
	DefaultTypingRate  = 2 // typing frames per second and client
	DefaultTypingBurst = 3
	DefaultBuffer      = 64
)

// Config configures a Hub. Service is required; a zero field means its
// default.
type Config struct {
	// Service is chat.Consumers or chat.Workers: the "from" of this
	// process's users.
	Service string
	// Prefix prefixes the channel name (chat.DefaultRedisPrefix).
	Prefix string
	// Heartbeat is how often the process republishes its presence
	// (DefaultHeartbeat, 2 s); entries of another process expire after
	// three heartbeats without a word.
	Heartbeat time.Duration
	// TypingRate and TypingBurst bound the typing signals one member sends
	// (per second; default 2 and 3); more are dropped.
	TypingRate  rate.Limit
	TypingBurst int
	// Buffer is the frames queued per member (DefaultBuffer); past it a
	// frame for that member is dropped (ephemeral: nothing is owed).
	Buffer int
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// Person is one user with the chat open: the service and the user (the
// token's sub; "" without auth).
type Person struct {
	From   string `json:"from"`
	Author string `json:"author"`
}

// wire is the message on the Redis channel.
type wire struct {
	Kind   string   `json:"kind"` // "typing" or "presence"
	Proc   string   `json:"proc"`
	Conn   string   `json:"conn,omitempty"`
	ChatID int64    `json:"chat_id"`
	From   string   `json:"from,omitempty"`
	Author string   `json:"author,omitempty"`
	Online []Person `json:"online,omitempty"`
}

type remote struct {
	online []Person
	until  time.Time
}

// Hub is one process's end of the live channel. Safe for concurrent use.
type Hub struct {
	rdb     redis.UniversalClient
	cfg     Config
	channel string
	proc    string
	log     *slog.Logger
	life    service.Lifecycle

	mu     sync.Mutex
	local  map[int64]map[*Member]struct{}
	remote map[int64]map[string]remote // chat → process → its users
	conns  int64
	// out queues the signals to publish; the run's publisher drains it.
	out chan wire
}

// Member is one WebSocket client in a chat. Frames (typing of others,
// presence) arrive on C. Leave (idempotent) removes it.
type Member struct {
	C <-chan []byte

	h      *Hub
	c      chan []byte
	chatID int64
	person Person
	conn   string
	lim    *rate.Limiter
	once   sync.Once
	// last is the presence frame last pushed to the member, sawOthers
	// whether it showed anyone else (both guarded by the hub's mu).
	last      string
	sawOthers bool
}

// New returns a Hub on rdb configured by cfg. Error: an unknown service.
// rdb may be unreachable: the Hub keeps trying to subscribe while started.
func New(rdb redis.UniversalClient, cfg *Config) (*Hub, error) {
	c := *cmp.Or(cfg, &Config{})
	if err := chat.CheckService(c.Service); err != nil {
		return nil, err
	}
	c.Prefix = cmp.Or(c.Prefix, chat.DefaultRedisPrefix)
	c.Heartbeat = cmp.Or(c.Heartbeat, DefaultHeartbeat)
	c.TypingRate = cmp.Or(c.TypingRate, DefaultTypingRate)
	c.TypingBurst = cmp.Or(c.TypingBurst, DefaultTypingBurst)
	c.Buffer = cmp.Or(c.Buffer, DefaultBuffer)
	log := cmp.Or(c.Logger, slog.Default())
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	h := &Hub{rdb: rdb, cfg: c, channel: c.Prefix + "live", proc: hex.EncodeToString(b),
		log:   log.With("component", "chat.live"),
		local: map[int64]map[*Member]struct{}{}, remote: map[int64]map[string]remote{},
		out: make(chan wire, 1024)}
	h.life.Name = "chat: live"
	return h, nil
}

// TTL is how long another process's presence lasts without a word.
func (h *Hub) TTL() time.Duration { return 3 * h.cfg.Heartbeat }

// Start subscribes and runs the heartbeat until Stop; it does not block.
func (h *Hub) Start(ctx context.Context) error {
	return h.life.Start(ctx, func(r *service.Run) {
		ps := h.rdb.Subscribe(r.Context(), h.channel)
		r.Go(func() {
			defer ps.Close()
			ch := ps.Channel(redis.WithChannelHealthCheckInterval(h.cfg.Heartbeat))
			for {
				select {
				case <-r.DrainContext().Done():
					return
				case m, ok := <-ch:
					if !ok {
						return
					}
					h.receive(m.Payload)
				}
			}
		})
		r.Go(func() {
			for {
				select {
				case <-r.DrainContext().Done():
					return
				case w := <-h.out:
					h.publishNow(r.Context(), w)
				}
			}
		})
		r.Every(h.cfg.Heartbeat, func(ctx context.Context) time.Duration {
			h.heartbeat(ctx)
			return h.cfg.Heartbeat
		})
	})
}

// Stop tells the others this process's users left, unsubscribes and waits.
func (h *Hub) Stop(ctx context.Context) error {
	h.mu.Lock()
	chats := make([]int64, 0, len(h.local))
	for id := range h.local {
		chats = append(chats, id)
	}
	h.mu.Unlock()
	for _, id := range chats {
		h.publishNow(ctx, wire{Kind: "presence", Proc: h.proc, ChatID: id, Online: nil})
	}
	return h.life.Stop(ctx)
}

// Join adds a client of author to chat chatID: it gets the chat's presence
// at once and whenever it changes, and the typing signals of every other
// client of the chat.
func (h *Hub) Join(chatID int64, author string) *Member {
	c := make(chan []byte, h.cfg.Buffer)
	h.mu.Lock()
	h.conns++
	m := &Member{C: c, h: h, c: c, chatID: chatID, person: Person{From: h.cfg.Service, Author: author},
		conn: strconv.FormatInt(h.conns, 10), lim: rate.NewLimiter(h.cfg.TypingRate, h.cfg.TypingBurst)}
	room := h.local[chatID]
	if room == nil {
		room = map[*Member]struct{}{}
		h.local[chatID] = room
	}
	room[m] = struct{}{}
	online := h.localOnline(chatID)
	h.mu.Unlock()
	h.changed(chatID)
	h.publish(wire{Kind: "presence", Proc: h.proc, ChatID: chatID, Online: online})
	return m
}

// Typing sends the member's typing signal to every other client of its
// chat, on this process at once and on the others through Redis. Signals
// over the rate are dropped. Never blocks on Redis (it publishes in the
// background).
func (m *Member) Typing() {
	if !m.lim.Allow() {
		return
	}
	h := m.h
	h.deliverTyping(m.chatID, m.person, m.conn, h.proc)
	h.publish(wire{Kind: "typing", Proc: h.proc, Conn: m.conn, ChatID: m.chatID, From: m.person.From, Author: m.person.Author})
}

// Leave removes the member; the others see the presence change.
func (m *Member) Leave() {
	m.once.Do(func() {
		h := m.h
		h.mu.Lock()
		room := h.local[m.chatID]
		delete(room, m)
		if len(room) == 0 {
			delete(h.local, m.chatID)
		}
		online := h.localOnline(m.chatID)
		h.mu.Unlock()
		h.changed(m.chatID)
		h.publish(wire{Kind: "presence", Proc: h.proc, ChatID: m.chatID, Online: online})
	})
}

// localOnline lists this process's users of chatID (h.mu held).
func (h *Hub) localOnline(chatID int64) []Person {
	var out []Person
	for m := range h.local[chatID] {
		if !slices.Contains(out, m.person) {
			out = append(out, m.person)
		}
	}
	return out
}

// publish queues w for the publisher; when the queue is full it is
// dropped (at-most-once).
func (h *Hub) publish(w wire) {
	select {
	case h.out <- w:
	default:
	}
}

// publishNow publishes w, within a second; a failure is only logged.
func (h *Hub) publishNow(ctx context.Context, w wire) {
	b, err := json.Marshal(w)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := h.rdb.Publish(ctx, h.channel, b).Err(); err != nil {
		h.log.Debug("live signal not published", "kind", w.Kind, "err", err)
	}
}

// receive handles a message from the channel.
func (h *Hub) receive(payload string) {
	var w wire
	if json.Unmarshal([]byte(payload), &w) != nil || w.Proc == h.proc || w.ChatID <= 0 {
		return
	}
	switch w.Kind {
	case "typing":
		if chat.Peer(w.From) == "" || len(w.Author) > 256 {
			return
		}
		h.deliverTyping(w.ChatID, Person{From: w.From, Author: w.Author}, w.Conn, w.Proc)
	case "presence":
		h.mu.Lock()
		procs := h.remote[w.ChatID]
		if len(w.Online) == 0 {
			delete(procs, w.Proc)
		} else {
			if procs == nil {
				procs = map[string]remote{}
				h.remote[w.ChatID] = procs
			}
			procs[w.Proc] = remote{online: w.Online, until: time.Now().Add(h.TTL())}
		}
		if len(procs) == 0 {
			delete(h.remote, w.ChatID)
		}
		h.mu.Unlock()
		h.changed(w.ChatID)
	}
}

// deliverTyping hands a typing frame to the chat's local members other
// than the sending connection (conn of process proc).
func (h *Hub) deliverTyping(chatID int64, p Person, conn, proc string) {
	b, _ := json.Marshal(struct {
		Type   string `json:"type"`
		ChatID int64  `json:"chat_id"`
		From   string `json:"from"`
		Author string `json:"author"`
	}{"typing", chatID, p.From, p.Author})
	h.mu.Lock()
	defer h.mu.Unlock()
	for m := range h.local[chatID] {
		if proc == h.proc && m.conn == conn {
			continue
		}
		m.offer(b)
	}
}

// changed pushes the chat's presence to each local member whose view
// changed: a member alone in the chat (no one else online) gets no frame,
// so a client that only reads messages sees none until someone else opens
// the chat; it gets one, too, when the last other person leaves.
func (h *Hub) changed(chatID int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	online := h.localOnline(chatID)
	for _, r := range h.remote[chatID] {
		for _, p := range r.online {
			if !slices.Contains(online, p) {
				online = append(online, p)
			}
		}
	}
	slices.SortFunc(online, func(a, b Person) int { return cmp.Or(cmp.Compare(a.From, b.From), cmp.Compare(a.Author, b.Author)) })
	if online == nil {
		online = []Person{}
	}
	b, _ := json.Marshal(struct {
		Type   string   `json:"type"`
		ChatID int64    `json:"chat_id"`
		Online []Person `json:"online"`
	}{"presence", chatID, online})
	for m := range h.local[chatID] {
		others := slices.ContainsFunc(online, func(p Person) bool { return p != m.person })
		if (others || m.sawOthers) && m.last != string(b) {
			m.offer(b)
			m.last = string(b)
		}
		m.sawOthers = others
	}
}

// heartbeat republishes this process's presence and drops the entries of
// processes that went quiet.
func (h *Hub) heartbeat(ctx context.Context) {
	now := time.Now()
	h.mu.Lock()
	mine := map[int64][]Person{}
	for id := range h.local {
		mine[id] = h.localOnline(id)
	}
	var expired []int64
	for id, procs := range h.remote {
		for p, r := range procs {
			if now.After(r.until) {
				delete(procs, p)
				expired = append(expired, id)
			}
		}
		if len(procs) == 0 {
			delete(h.remote, id)
		}
	}
	h.mu.Unlock()
	for _, id := range expired {
		h.changed(id)
	}
	for id, online := range mine {
		h.publishNow(ctx, wire{Kind: "presence", Proc: h.proc, ChatID: id, Online: online})
	}
}

// offer queues b, dropping it when the member's buffer is full.
func (m *Member) offer(b []byte) {
	select {
	case m.c <- b:
	default:
	}
}
