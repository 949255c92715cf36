package chat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgxlisten"

	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/internal/service"
)

// Gateway defaults.
const (
	DefaultGatewayPoll  = time.Second
	DefaultGapTimeout   = 60 * time.Second
	DefaultClientBuffer = 1024
	gatewayPageSize     = 500
	// maxAboveGap bounds the seqs a subscriber has pushed past missing
	// ones (all its gaps together) before the gateway stops waiting for
	// the missing messages (must stay under the page size, or a page could
	// hold nothing new).
	maxAboveGap          = gatewayPageSize / 2
	gatewayReconnectWait = 250 * time.Millisecond
	// maxHolderReads bounds the reads of one room per push for subscribers
	// holding gaps at distinct cursors (the lowest ones are read; the rest
	// wait for a later push).
	maxHolderReads = 8
)

// GatewayConfig configures a Gateway. A zero field means its default.
type GatewayConfig struct {
	// Channels are the NOTIFY channels that signal new rows: the service's
	// inbox channel (payload: comma-separated chat ids, or empty for "any")
	// and its outbox channel (empty payload). Required.
	Channels []string
	// PollInterval is the fallback re-read of every room with subscribers,
	// catching any lost wake-up. Default DefaultGatewayPoll (1 s); must not
	// be negative.
	PollInterval time.Duration
	// GapTimeout is how long a room holds received messages behind a missing
	// seq (one still in flight, e.g. a reclaimed job) before pushing them
	// anyway; the missing message is pushed when it comes, out of order
	// (unless 250 or more messages were pushed past it by then: it is then
	// only in the history). Default 0 means DefaultGapTimeout (60 s, twice the
	// default lock duration); negative means no hold at all.
	GapTimeout time.Duration
	// ClientBuffer is the number of frames queued per subscriber; a
	// subscriber that falls further behind is evicted (it reconnects and
	// catches up by seq). Default DefaultClientBuffer (1024); must not be
	// negative.
	ClientBuffer int
	// Ignore, when set, drops notifications for which it returns true —
	// those the caller has already turned into Wake calls (Serve drops the
	// outbox channel's notifications sent by its own process: its sends
	// wake their rooms directly, while a notification with no chat id would
	// re-read every room). Called from the LISTEN goroutine.
	Ignore func(channel string, senderPID uint32) bool
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// Gateway pushes a service's chat messages to live subscribers, room by room
// (one room per chat id). It learns of new rows from Postgres — LISTEN on the
// configured channels, a poll fallback, and a re-read after every reconnect
// — and, as a shortcut, from its own process after a commit (Offer: rows
// already committed, pushed without reading them back). Every row is in
// Postgres before the gateway hears of it, and a subscriber that reconnects
// catches up by seq, so a crash between a commit and the push loses nothing
// (invariant 7).
//
// Each subscriber has its own cursors (last seq seen of this service's
// messages and of the other's); the single gateway goroutine advances them,
// so a subscriber sees every message once and each origin in seq order;
// received messages behind a missing one are held for GapTimeout, after
// which they are pushed and the missing one comes out of order. Gateway is
// safe for concurrent use.
type Gateway struct {
	pool     *pgxpool.Pool
	service  string
	cfg      GatewayConfig
	log      *slog.Logger
	query    string
	mu       sync.Mutex
	rooms    map[int64]map[*Subscription]struct{}
	dirty    map[int64]struct{}
	allDirty bool
	offered  map[int64]*roomRows // committed rows handed over by Offer, per room with subscribers
	running  bool                // between Start and Stop: Offer keeps rows only then
	wake     chan struct{}
	life     service.Lifecycle
}

// Subscription is one live subscriber of a room. Frames (JSON-encoded
// Message values) arrive on C in order. Evicted is closed when the
// subscriber fell ClientBuffer frames behind; the caller should then close
// the connection so the client reconnects with its cursors. Close
// unsubscribes; it is idempotent.
type Subscription struct {
	C       <-chan []byte
	Evicted <-chan struct{}

	g       *Gateway
	chatID  int64
	c       chan []byte
	evicted chan struct{}
	once    sync.Once
	// Owned by the gateway goroutine after Subscribe returns.
	sent, recv int64
	gapSince   time.Time
	// above holds the received seqs pushed past a gap, beyond recv (the
	// watermark: every seq up to it was pushed).
	above map[int64]bool
}

// WithDefaults returns a copy of c in which every zero field holds its
// default: PollInterval DefaultGatewayPoll, GapTimeout DefaultGapTimeout,
// ClientBuffer DefaultClientBuffer, Logger slog.Default(). A nil c gives a
// config of defaults without Channels.
func (c *GatewayConfig) WithDefaults() *GatewayConfig {
	var d GatewayConfig
	if c != nil {
		d = *c
	}
	if d.PollInterval == 0 {
		d.PollInterval = DefaultGatewayPoll
	}
	if d.GapTimeout == 0 {
		d.GapTimeout = DefaultGapTimeout
	}
	if d.ClientBuffer == 0 {
		d.ClientBuffer = DefaultClientBuffer
	}
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	return &d
}

// validate checks a config that went through WithDefaults.
func (c *GatewayConfig) validate() error {
	switch {
	case len(c.Channels) == 0:
		return errors.New("chat: gateway needs at least one channel")
	case c.PollInterval < 0:
		return fmt.Errorf("chat: gateway: negative PollInterval %v", c.PollInterval)
	case c.ClientBuffer < 0:
		return fmt.Errorf("chat: gateway: negative ClientBuffer %d", c.ClientBuffer)
	}
	return nil
}

// NewGateway returns a Gateway for service on pool. It validates cfg after
// GatewayConfig.WithDefaults: an error for an unknown service, no Channels,
// or a negative PollInterval or ClientBuffer (a negative GapTimeout means
// no hold).
func NewGateway(pool *pgxpool.Pool, service string, cfg *GatewayConfig) (*Gateway, error) {
	if err := checkService(service); err != nil {
		return nil, err
	}
	c := *cfg.WithDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	log := c.Logger
	s := pgx.Identifier{service}.Sanitize()
	page := strconv.Itoa(gatewayPageSize)
	// One round trip reads every dirty room: a LATERAL page per room and
	// origin, from the subscribers' lowest cursors on.
	// A room may be read from two cursors (see push); k is the 1-based
	// index of the (chat, cursors) entry a row was read for.
	q := `SELECT r.k, r.chat_id, false, m.id::text, m.seq, m.body, m.created_at, NULL::timestamptz, $4::text
		FROM unnest($1::bigint[], $2::bigint[]) WITH ORDINALITY AS r(chat_id, after, k)
		CROSS JOIN LATERAL (SELECT id, seq, body, created_at FROM ` + s + `.messages
			WHERE chat_id = r.chat_id AND seq > r.after ORDER BY seq LIMIT ` + page + `) m
		UNION ALL
		SELECT r.k, r.chat_id, true, i.message_id::text, i.seq, i.body, i.sent_at, i.received_at, i.sender
		FROM unnest($1::bigint[], $3::bigint[]) WITH ORDINALITY AS r(chat_id, after, k)
		CROSS JOIN LATERAL (SELECT message_id, seq, body, sent_at, received_at, sender FROM ` + s + `.inbox
			WHERE chat_id = r.chat_id AND seq > r.after ORDER BY seq LIMIT ` + page + `) i`
	return &Gateway{
		pool: pool, service: service, cfg: c, query: q,
		log:   log.With("component", "chat.gateway", "service", service),
		rooms: map[int64]map[*Subscription]struct{}{}, dirty: map[int64]struct{}{},
		wake: make(chan struct{}, 1),
	}, nil
}

// Start starts the LISTEN loop and the push loop and returns at once. It
// follows the contract of internal/service: they run until Stop, or until
// ctx is cancelled (a hard stop). Errors: outbox.ErrAlreadyStarted while a
// run is in progress, or ctx.Err() (both wrapped).
func (g *Gateway) Start(ctx context.Context) error {
	l := &pgxlisten.Listener{
		Connect: func(ctx context.Context) (*pgx.Conn, error) {
			cc := g.pool.Config().ConnConfig.Copy()
			cc.RuntimeParams["application_name"] = "outboxchat-gateway"
			return pgx.ConnectConfig(ctx, cc)
		},
		LogError: func(ctx context.Context, err error) {
			if ctx.Err() == nil {
				g.log.Warn("listen", "err", err)
			}
		},
		ReconnectDelay: gatewayReconnectWait,
	}
	for _, ch := range g.cfg.Channels {
		l.Handle(ch, listenHandler{g})
	}
	err := g.life.Start(ctx, func(r *service.Run) {
		g.mu.Lock()
		g.running = true
		g.mu.Unlock()
		r.Go(func() { _ = l.Listen(r.DrainContext()) })
		r.Go(func() {
			g.loop(r.DrainContext())
			g.mu.Lock()
			g.running, g.offered = false, nil
			g.mu.Unlock()
		})
	})
	if err != nil {
		return fmt.Errorf("chat: start gateway: %w", err)
	}
	return nil
}

// Stop stops both loops (the LISTEN connection closes, a read in flight is
// cancelled) and waits for them. Subscriptions stay open; their owners
// close them. Idempotent; nil if not running; ctx bounds the wait (its
// error is returned wrapped).
func (g *Gateway) Stop(ctx context.Context) error {
	if err := g.life.Stop(ctx); err != nil {
		return fmt.Errorf("chat: stop gateway: %w", err)
	}
	return nil
}

// Started returns a channel closed once the latest Start succeeded.
func (g *Gateway) Started() <-chan struct{} { return g.life.Started() }

// Stopped returns a channel closed once the latest run's loops have
// returned (closed before the first Start).
func (g *Gateway) Stopped() <-chan struct{} { return g.life.Stopped() }

type listenHandler struct{ g *Gateway }

func (h listenHandler) HandleNotification(_ context.Context, n *pgconn.Notification, _ *pgx.Conn) error {
	if h.g.cfg.Ignore != nil && h.g.cfg.Ignore(n.Channel, n.PID) {
		return nil
	}
	if n.Payload == "" {
		h.g.WakeAll()
		return nil
	}
	for _, f := range strings.Split(n.Payload, ",") {
		id, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			h.g.WakeAll()
			return nil
		}
		h.g.Wake(id)
	}
	return nil
}

// HandleBacklog runs after every (re)connect of the LISTEN connection:
// whatever was committed while it was down is read now.
func (h listenHandler) HandleBacklog(context.Context, string, *pgx.Conn) error {
	h.g.WakeAll()
	return nil
}

// Wake marks chat chatID as changed. It never blocks.
func (g *Gateway) Wake(chatID int64) {
	g.mu.Lock()
	if _, ok := g.rooms[chatID]; ok {
		g.dirty[chatID] = struct{}{}
	}
	g.mu.Unlock()
	g.signal()
}

// Offer hands the gateway messages that are already committed — this
// process's own sends after their commit (received false), or received
// messages after their inbox commit (received true, ReceivedAt set) — so
// that it can push them without reading them back: one round trip and, for
// received ones, the NOTIFY hop fewer on every message's way to the screen.
// Rows must be exactly as stored (the frames are the same either way).
// Messages of rooms without subscribers are dropped (a new subscriber reads
// the room from Postgres). A subscriber that cannot take the offered rows
// in seq order right away (its cursor is behind the first of them, or it is
// holding a gap) gets the room read from Postgres instead, so an Offer is
// never the only way a row reaches a client: a lost one is only slower.
// Offering rows before their commit would break invariant 7. Rows offered
// while the gateway is not started are dropped. Never blocks; safe for
// concurrent use.
func (g *Gateway) Offer(received bool, ms []Message) {
	if len(ms) == 0 {
		return
	}
	g.mu.Lock()
	for _, m := range ms {
		if _, ok := g.rooms[m.ChatID]; !ok || !g.running {
			continue
		}
		if g.offered == nil {
			g.offered = map[int64]*roomRows{}
		}
		rr := g.offered[m.ChatID]
		if rr == nil {
			rr = &roomRows{}
			g.offered[m.ChatID] = rr
		}
		if received {
			rr.recv = append(rr.recv, m)
		} else {
			rr.sent = append(rr.sent, m)
		}
	}
	g.mu.Unlock()
	g.signal()
}

// offerApplied is the worker's inbox.Config.AfterCommit when the gateway is
// in the same process (whose inbox NOTIFYs it then ignores): it offers the
// stored messages the handler returned, and wakes the room of any delivery
// without one (a handler that returns no row, such as the lab's fault
// wrapper), so that it is read as the ignored NOTIFY would have made it.
func (g *Gateway) offerApplied(applied []inbox.Applied) {
	ms := make([]Message, 0, len(applied))
	for _, a := range applied {
		if m, ok := a.Value.(Message); ok {
			ms = append(ms, m)
		} else if m, err := DecodeEvent(a.Delivery.Payload); err == nil {
			g.Wake(m.ChatID)
		} else {
			g.WakeAll()
		}
	}
	g.Offer(true, ms)
}

// WakeAll marks every room as changed. It never blocks.
func (g *Gateway) WakeAll() {
	g.mu.Lock()
	g.allDirty = true
	g.mu.Unlock()
	g.signal()
}

func (g *Gateway) signal() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// Subscribe joins room chatID. afterSent and afterReceived are the last seqs
// the subscriber has already seen of this service's own messages and of the
// other service's; everything after them is pushed first (catch-up), then
// live messages.
func (g *Gateway) Subscribe(chatID, afterSent, afterReceived int64) *Subscription {
	c := make(chan []byte, g.cfg.ClientBuffer)
	ev := make(chan struct{})
	s := &Subscription{C: c, Evicted: ev, g: g, chatID: chatID, c: c, evicted: ev, sent: afterSent, recv: afterReceived}
	g.mu.Lock()
	room := g.rooms[chatID]
	if room == nil {
		room = map[*Subscription]struct{}{}
		g.rooms[chatID] = room
	}
	room[s] = struct{}{}
	g.dirty[chatID] = struct{}{}
	g.mu.Unlock()
	g.signal()
	return s
}

// Close leaves the room. Idempotent.
func (s *Subscription) Close() {
	s.once.Do(func() {
		g := s.g
		g.mu.Lock()
		if room := g.rooms[s.chatID]; room != nil {
			delete(room, s)
			if len(room) == 0 {
				delete(g.rooms, s.chatID)
				delete(g.dirty, s.chatID)
			}
		}
		g.mu.Unlock()
	})
}

// Subscribers returns the number of live subscriptions (for metrics).
func (g *Gateway) Subscribers() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, r := range g.rooms {
		n += len(r)
	}
	return n
}

func (g *Gateway) loop(ctx context.Context) {
	tick := time.NewTicker(g.cfg.PollInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.wake:
		case <-tick.C:
			g.mu.Lock()
			g.allDirty = true
			g.mu.Unlock()
		}
		more, err := g.push(ctx)
		if err != nil && ctx.Err() == nil {
			g.log.Warn("read new messages", "err", err)
			// Try again at the next wake-up or tick; the cursors did not move.
			g.mu.Lock()
			g.allDirty = true
			g.mu.Unlock()
			continue
		}
		if more {
			g.signal()
		}
	}
}

// roomRows is one room's rows of a push, and their JSON frames, encoded
// once per push however many subscribers the room has.
type roomRows struct {
	sent, recv []Message
	frames     map[frameKey][]byte // encoded Messages
}

// frameKey names one message of a room: its origin and id (an id is unique
// per origin only; a faulty or forged peer could reuse one of ours).
type frameKey struct {
	from string
	id   string
}

// frame returns m's JSON encoding, encoding it on first use.
func (rr *roomRows) frame(m Message) ([]byte, error) {
	k := frameKey{m.From, m.ID}
	if b, ok := rr.frames[k]; ok {
		return b, nil
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	if rr.frames == nil {
		rr.frames = map[frameKey][]byte{}
	}
	rr.frames[k] = b
	return b, nil
}

// push delivers Offer's rows where it can, then reads the dirty rooms from
// their subscribers' lowest cursors (those holding a gap apart) and hands
// each subscriber what it has not seen. It reports whether to read again at
// once: a page came back full and some subscriber of its room moved on.
func (g *Gateway) push(ctx context.Context) (bool, error) {
	g.mu.Lock()
	var ids, afterSent, afterRecv []int64
	subs := map[int64][]*Subscription{}
	offered := g.offered
	g.offered = nil
	for id, room := range g.rooms {
		if _, ok := g.dirty[id]; !ok && !g.allDirty {
			if rr := offered[id]; rr != nil {
				for s := range room {
					subs[id] = append(subs[id], s)
				}
			}
			continue
		}
		delete(offered, id) // the read below sees them: they were committed before it
		// Subscribers holding received messages behind a gap are each read
		// from their own cursor, apart from the others: a full page past
		// one's gap must neither hold back the others (they would get
		// nothing newer until that gap closed) nor make the gateway re-read
		// at once (it makes no progress; holds are looked at again at the
		// tick). The others share one read from their lowest cursor.
		ms, mr := int64(math.MaxInt64), int64(math.MaxInt64)
		var holders []int64
		for s := range room {
			subs[id] = append(subs[id], s)
			ms = min(ms, s.sent)
			if s.holding() {
				holders = append(holders, s.recv)
			} else {
				mr = min(mr, s.recv)
			}
		}
		if mr != math.MaxInt64 || len(holders) == 0 {
			ids, afterSent, afterRecv = append(ids, id), append(afterSent, ms), append(afterRecv, mr)
			ms = math.MaxInt64 // sends are read once
		}
		slices.Sort(holders)
		holders = slices.Compact(holders)
		for _, h := range holders[:min(len(holders), maxHolderReads)] {
			ids, afterSent, afterRecv = append(ids, id), append(afterSent, ms), append(afterRecv, h)
			ms = math.MaxInt64
		}
	}
	g.dirty = map[int64]struct{}{}
	g.allDirty = false
	g.mu.Unlock()
	if len(offered) > 0 && g.pushOffered(offered, subs) {
		g.signal() // some rooms need a read after all
	}
	if len(ids) == 0 {
		return false, nil
	}
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rows, err := g.pool.Query(qctx, g.query, ids, afterSent, afterRecv, g.service)
	if err != nil {
		g.markDirty(ids)
		return false, err
	}
	more := false
	byRoom := map[int64]*roomRows{}
	type pageKey struct {
		k        int64
		received bool
	}
	pages := map[pageKey]int{}
	full := map[int64]bool{} // rooms with a full page: there may be more to read
	for rows.Next() {
		var m Message
		var k int64
		var received bool
		var recvAt *time.Time
		if err := rows.Scan(&k, &m.ChatID, &received, &m.ID, &m.Seq, &m.Body, &m.SentAt, &recvAt, &m.From); err != nil {
			rows.Close()
			g.markDirty(ids)
			return false, err
		}
		m.ReceivedAt = recvAt
		if pages[pageKey{k, received}]++; pages[pageKey{k, received}] == gatewayPageSize {
			full[m.ChatID] = true
		}
		rr := byRoom[m.ChatID]
		if rr == nil {
			rr = &roomRows{}
			byRoom[m.ChatID] = rr
		}
		if received {
			rr.recv = append(rr.recv, m)
		} else {
			rr.sent = append(rr.sent, m)
		}
	}
	if err := rows.Err(); err != nil {
		g.markDirty(ids)
		return false, err
	}
	now := time.Now()
	for id, rr := range byRoom {
		rr.sent, rr.recv = bySeq(rr.sent), bySeq(rr.recv)
		progress := false
		for _, s := range subs[id] {
			sent, recv, above, holding := s.sent, s.recv, len(s.above), s.holding()
			// A held gap is looked at again at the next tick, which reads
			// every room, or when the room is woken.
			g.deliver(s, rr, now)
			// A subscriber that starts holding has moved on too: it gets a
			// read of its own from now on, and the others theirs.
			progress = progress || s.sent != sent || s.recv != recv || len(s.above) != above || s.holding() != holding
		}
		if full[id] && progress {
			// Read on at once. A full page nobody could take (everything
			// in it is held behind a gap) waits for the tick instead of
			// being read again and again.
			more = true
			g.markDirty([]int64{id})
		}
	}
	return more, nil
}

// pushOffered delivers Offer's rows of rooms that need no read, room by room:
// only if every subscriber of the room can take them in seq order from its
// cursors; otherwise the room is marked dirty (the caller signals another
// push, which reads it). It reports whether it marked any.
func (g *Gateway) pushOffered(offered map[int64]*roomRows, subs map[int64][]*Subscription) (marked bool) {
	now := time.Now()
	for id, rr := range offered {
		ss := subs[id]
		if len(ss) == 0 {
			continue // the room emptied (or was read) meanwhile
		}
		rr.sent, rr.recv = bySeq(rr.sent), bySeq(rr.recv)
		ok := true
		for _, s := range ss {
			if !s.takes(rr) {
				ok = false
				break
			}
		}
		if !ok {
			g.markDirty([]int64{id})
			marked = true
			continue
		}
		for _, s := range ss {
			// A gap inside the offered received rows is held: looked at
			// again at the next tick, which reads every room, or when the
			// room is woken.
			g.deliver(s, rr, now)
			if len(rr.sent) > 0 && s.sent < rr.sent[len(rr.sent)-1].Seq {
				// A gap inside the offered sends (another process's send
				// between two of ours): read the room now.
				g.markDirty([]int64{id})
				marked = true
			}
		}
	}
	return marked
}

// holding reports whether s is holding received messages behind a gap, or
// has pushed some past one (its watermark is below them).
func (s *Subscription) holding() bool { return !s.gapSince.IsZero() || len(s.above) > 0 }

// bySeq sorts ms by seq and drops repeated seqs (a room read from two
// cursors returns the rows above the higher one twice).
func bySeq(ms []Message) []Message {
	sort.Slice(ms, func(i, j int) bool { return ms[i].Seq < ms[j].Seq })
	return slices.CompactFunc(ms, func(a, b Message) bool { return a.Seq == b.Seq })
}

// takes reports whether s can take rr's rows without a read: each origin's
// first row is at or below the subscriber's next seq, and no gap is held.
func (s *Subscription) takes(rr *roomRows) bool {
	if s.holding() {
		return false
	}
	if len(rr.sent) > 0 && rr.sent[0].Seq > s.sent+1 {
		return false
	}
	if len(rr.recv) > 0 && rr.recv[0].Seq > s.recv+1 {
		return false
	}
	return true
}

func (g *Gateway) markDirty(ids []int64) {
	g.mu.Lock()
	for _, id := range ids {
		g.dirty[id] = struct{}{}
	}
	g.mu.Unlock()
}

// deliver queues to s the rows after its cursors, merged by sent_at
// (mergeBySentAt keeps each origin in seq order). It
// reports whether received rows are held back behind a seq gap.
func (g *Gateway) deliver(s *Subscription, rr *roomRows, now time.Time) (held bool) {
	var sent, recv []Message
	for _, m := range rr.sent {
		if m.Seq == s.sent+1 {
			sent = append(sent, m)
			s.sent = m.Seq
		}
	}
	for _, m := range rr.recv {
		if m.Seq <= s.recv || s.above[m.Seq] {
			continue // seen: at or below the watermark, or pushed past a gap
		}
		if m.Seq == s.recv+1 {
			recv = append(recv, m)
			s.recv = m.Seq
			// A late message may close a gap that was given up on: move the
			// watermark over what was already pushed above it.
			for s.above[s.recv+1] {
				delete(s.above, s.recv+1)
				s.recv++
			}
			if len(s.above) == 0 {
				s.gapSince = time.Time{}
			}
			continue
		}
		// A gap: an earlier message of the other side is not in the inbox
		// yet (in flight, or reclaimed after a crash). Hold the later ones,
		// up to GapTimeout, so the room shows that side's messages in seq
		// order; after that push them, and push the missing one whenever it
		// comes (the watermark stays below it, so it is still read).
		held = true
		if s.gapSince.IsZero() {
			s.gapSince = now
		}
		if g.cfg.GapTimeout > 0 && now.Sub(s.gapSince) < g.cfg.GapTimeout {
			break
		}
		if len(s.above) == 0 && g.cfg.GapTimeout > 0 {
			g.log.Warn("pushing past a missing message", "chat_id", s.chatID, "missing_seq", s.recv+1, "next_seq", m.Seq)
		}
		if s.above == nil {
			s.above = map[int64]bool{}
		}
		recv = append(recv, m)
		s.above[m.Seq] = true
		if len(s.above) >= maxAboveGap {
			// Too far past the gap to keep re-reading: move the watermark
			// to the highest seq pushed; a message below it that comes
			// later is in the history, not pushed live.
			for q := range s.above {
				s.recv = max(s.recv, q)
			}
			clear(s.above)
			s.gapSince = time.Time{}
			g.log.Warn("gave up on a missing message", "chat_id", s.chatID, "watermark", s.recv)
		}
	}
	for _, m := range mergeBySentAt(sent, recv) {
		b, err := rr.frame(m)
		if err != nil {
			continue
		}
		select {
		case s.c <- b:
		default:
			s.evict()
			return false
		}
	}
	return held
}

func (s *Subscription) evict() {
	select {
	case <-s.evicted:
	default:
		close(s.evicted)
	}
	s.Close()
}
