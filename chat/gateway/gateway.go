package gateway

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxchat/outboxchat/chat"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/internal/notifier"
	"github.com/outboxchat/outboxchat/internal/service"
)

// Gateway defaults.
const (
	DefaultGatewayPoll  = time.Second
	DefaultGapTimeout   = 60 * time.Second
	DefaultClientBuffer = 1024
	// subscriberChan bounds a subscription's channel (C): the frames a
	// subscriber may be behind beyond it wait in a backlog that exists only
	// while it is behind (Subscription.offer), so an idle subscriber holds
	// 64 slots (1.5 KiB), not ClientBuffer (24 KiB at the default).
	subscriberChan  = 64
	gatewayPageSize = 500
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

// Config configures a Gateway. A zero field means its default.
type Config struct {
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
	// negative. Up to 64 of them wait in the subscription's channel, the
	// rest in a backlog that is allocated only while the subscriber is
	// behind, and freed once it has caught up.
	ClientBuffer int
	// Notifier is the process's shared LISTEN connection; the gateway
	// subscribes to Channels on it while started (the caller starts and
	// stops it). Default nil: the gateway runs a notifier of its own
	// (application_name outboxchat-gateway).
	Notifier *notifier.Notifier
	// SkipOwnOn lists the channels on which the notifications sent by this
	// process's own connections (Notifier's Config.Own) are dropped: those
	// the process already turns into Wake or Offer calls (Serve drops its
	// own outbox notifications: its sends are offered directly, while a
	// notification with no chat id would re-read every room). Default none.
	SkipOwnOn []string
	// OnPush, when set, is called after a received message that carries a
	// trace context (chat.Message.TraceParent) was queued to a subscriber,
	// with the time its push began (the tracing's gateway span). It runs on
	// the gateway goroutine and must not block. Default nil.
	OnPush func(m chat.Message, began time.Time)
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
	cfg      Config
	log      *slog.Logger
	query    string
	mu       sync.Mutex
	rooms    map[int64]map[*Subscription]struct{}
	dirty    map[int64]struct{}
	allDirty bool
	offered  map[int64]*roomRows   // committed rows handed over by Offer, per room with subscribers
	receipts map[int64]receiptNote // receipts to push, per room with subscribers (highest seq)
	// changes and reads: edits, deletes and read receipts to push
	// (changes.go); changesQuery reads the changed messages.
	changes      map[changeRef]int64
	reads        map[int64]receiptNote
	changesQuery string
	running      bool // between Start and Stop: Offer keeps rows only then
	wake         chan struct{}
	life         service.Lifecycle
	notifier     *notifier.Notifier
	// ownNotify: notifier is the gateway's own, started and stopped with it.
	ownNotify bool
}

// Subscription is one live subscriber of a room. Frames (JSON-encoded
// Message values) arrive on C in order. C holds up to 64 frames; while the
// subscriber is further behind, the rest wait in a backlog that a goroutine
// of the subscription feeds into C (both freed once it caught up). Evicted
// is closed when the subscriber fell ClientBuffer frames behind; the caller
// should then close the connection so the client reconnects with its
// cursors. Close unsubscribes (and ends that goroutine); it is idempotent.
type Subscription struct {
	C       <-chan []byte
	Evicted <-chan struct{}

	g       *Gateway
	chatID  int64
	c       chan []byte
	evicted chan struct{}
	once    sync.Once
	// closed is closed by Close: it ends a pump.
	closed chan struct{}
	// limit is Config.ClientBuffer. pumping is true while a pump goroutine
	// moves backlog into c (set by the gateway goroutine, cleared by the
	// pump once backlog is empty); mu guards backlog and the change of
	// pumping.
	limit   int
	mu      sync.Mutex
	pumping atomic.Bool
	backlog [][]byte
	// cur is the subscriber's position in the room (room.go), owned by the
	// gateway goroutine after Subscribe returns.
	cur cursor
}

// WithDefaults returns a copy of c in which every zero field holds its
// default: PollInterval DefaultGatewayPoll, GapTimeout DefaultGapTimeout,
// ClientBuffer DefaultClientBuffer, Logger slog.Default(). A nil c gives a
// config of defaults without Channels.
func (c *Config) WithDefaults() *Config {
	d := *cmp.Or(c, &Config{})
	d.PollInterval = cmp.Or(d.PollInterval, DefaultGatewayPoll)
	d.GapTimeout = cmp.Or(d.GapTimeout, DefaultGapTimeout)
	d.ClientBuffer = cmp.Or(d.ClientBuffer, DefaultClientBuffer)
	d.Logger = cmp.Or(d.Logger, slog.Default())
	return &d
}

// validate checks a config that went through WithDefaults.
func (c *Config) validate() error {
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

// New returns a Gateway for service on pool. It validates cfg after
// Config.WithDefaults: an error for an unknown service, no Channels,
// or a negative PollInterval or ClientBuffer (a negative GapTimeout means
// no hold).
func New(pool *pgxpool.Pool, service string, cfg *Config) (*Gateway, error) {
	if err := chat.CheckService(service); err != nil {
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
	// Each row carries its origin's floor in the room: seqs up to it were
	// all stored once (seq_floors on the sending side, the newest gap fill
	// on the receiving side), so one that is missing below it was deleted,
	// not in flight (cursor.skipDeleted).
	// A message's delivered_at is the time of the first receipt at or
	// above its seq; it is looked up only for messages the room's newest
	// receipt covers (a catch-up), not for the live ones, which no receipt
	// covers yet (their receipt frame follows).
	q := `SELECT r.k, r.chat_id, false, m.id::text, m.seq, m.body, m.created_at, NULL::timestamptz, $4::text,
			CASE WHEN m.seq <= w.upto THEN (SELECT d.delivered_at FROM ` + s + `.receipts d
				WHERE d.chat_id = r.chat_id AND d.upto_seq >= m.seq ORDER BY d.upto_seq LIMIT 1) END,
			coalesce(m.author, ''), fl.floor, '', m.version, m.edited_at, m.deleted,
			CASE WHEN m.seq <= w.rupto THEN (SELECT x.read_at FROM ` + s + `.reads x
				WHERE x.chat_id = r.chat_id AND x.upto_seq >= m.seq ORDER BY x.upto_seq LIMIT 1) END
		FROM unnest($1::bigint[], $2::bigint[]) WITH ORDINALITY AS r(chat_id, after, k)
		CROSS JOIN LATERAL (SELECT coalesce((SELECT upto_seq FROM ` + s + `.receipts
			WHERE chat_id = r.chat_id ORDER BY upto_seq DESC LIMIT 1), 0) AS upto,
			coalesce((SELECT upto_seq FROM ` + s + `.reads
			WHERE chat_id = r.chat_id ORDER BY upto_seq DESC LIMIT 1), 0) AS rupto) w
		CROSS JOIN LATERAL (SELECT coalesce((SELECT f.seq FROM ` + s + `.seq_floors f
			WHERE f.chat_id = r.chat_id ORDER BY f.seq DESC LIMIT 1), 0) AS floor) fl
		CROSS JOIN LATERAL (SELECT id, seq, body, created_at, author, version, edited_at, deleted FROM ` + s + `.messages
			WHERE chat_id = r.chat_id AND seq > r.after ORDER BY seq LIMIT ` + page + `) m
		UNION ALL
		SELECT r.k, r.chat_id, true, i.message_id::text, i.seq, i.body, i.sent_at, i.received_at, i.sender, i.received_at, coalesce(i.author, ''), fl.floor, coalesce(i.traceparent, ''),
			i.version, i.edited_at, i.deleted, NULL::timestamptz
		FROM unnest($1::bigint[], $3::bigint[]) WITH ORDINALITY AS r(chat_id, after, k)
		CROSS JOIN LATERAL (SELECT coalesce((SELECT g.upto FROM ` + s + `.inbox_gap_fills g
			WHERE g.chat_id = r.chat_id ORDER BY g.upto DESC LIMIT 1), 0) AS floor) fl
		CROSS JOIN LATERAL (SELECT message_id, seq, body, sent_at, received_at, sender, author, traceparent, version, edited_at, deleted FROM ` + s + `.inbox
			WHERE chat_id = r.chat_id AND seq > r.after ORDER BY seq LIMIT ` + page + `) i`
	g := &Gateway{
		pool: pool, service: service, cfg: c, query: q, changesQuery: changesSQL(service),
		log:   log.With("component", "chat.gateway", "service", service),
		rooms: map[int64]map[*Subscription]struct{}{}, dirty: map[int64]struct{}{},
		wake:     make(chan struct{}, 1),
		notifier: c.Notifier,
	}
	g.life.Name = "chat: gateway"
	if g.notifier == nil {
		n, err := notifier.New(&notifier.Config{
			ConnConfig: pool.Config().ConnConfig, ApplicationName: "outboxchat-gateway",
			ReconnectMin: gatewayReconnectWait, ReconnectMax: gatewayReconnectWait, Logger: g.log,
		})
		if err != nil {
			return nil, fmt.Errorf("chat: gateway: %w", err)
		}
		g.notifier, g.ownNotify = n, true
	}
	return g, nil
}

// Start starts the LISTEN loop and the push loop and returns at once. It
// follows the contract of internal/service: they run until Stop, or until
// ctx is cancelled (a hard stop). Errors: outbox.ErrAlreadyStarted while a
// run is in progress, or ctx.Err() (both wrapped).
func (g *Gateway) Start(ctx context.Context) error {
	return g.life.Start(ctx, func(r *service.Run) {
		g.mu.Lock()
		g.running = true
		g.mu.Unlock()
		r.Go(func() {
			var unsubscribe []func()
			for _, ch := range g.cfg.Channels {
				notify := g.onNotify
				switch ch {
				case chat.ReceiptChannel(g.service):
					notify = g.onReceiptNotify
				case chat.ChangeChannel(g.service):
					notify = g.onChangeNotify
				case chat.ReadChannel(g.service):
					notify = g.onReadNotify
				}
				unsubscribe = append(unsubscribe, g.notifier.Subscribe(notifier.Subscription{
					Channel: ch, SkipOwn: slices.Contains(g.cfg.SkipOwnOn, ch),
					Notify: notify,
					// After every (re)connect of the LISTEN connection:
					// whatever was committed while it was down is read now.
					Up: g.WakeAll,
				}))
			}
			if g.ownNotify {
				_ = g.notifier.Start(r.Context())
			}
			g.loop(r.DrainContext())
			for _, u := range unsubscribe {
				u()
			}
			if g.ownNotify {
				_ = g.notifier.Stop(r.Context())
			}
			g.mu.Lock()
			g.running, g.offered, g.receipts, g.changes, g.reads = false, nil, nil, nil, nil
			g.mu.Unlock()
		})
	})
}

// Stop stops both loops (the LISTEN connection closes, a read in flight is
// cancelled) and waits for them. Subscriptions stay open; their owners
// close them. Idempotent; nil if not running; ctx bounds the wait (its
// error is returned wrapped).
func (g *Gateway) Stop(ctx context.Context) error {
	return g.life.Stop(ctx)
}

// Started returns a channel closed once the latest Start succeeded.
func (g *Gateway) Started() <-chan struct{} { return g.life.Started() }

// Stopped returns a channel closed once the latest run's loops have
// returned (closed before the first Start).
func (g *Gateway) Stopped() <-chan struct{} { return g.life.Stopped() }

// onNotify wakes the rooms a notification names: its payload is a
// comma-separated list of chat ids, or empty (or unreadable) for "any".
// Called from the notifier's goroutine.
func (g *Gateway) onNotify(payload string, _ uint32) {
	if payload == "" {
		g.WakeAll()
		return
	}
	for _, f := range strings.Split(payload, ",") {
		id, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			g.WakeAll()
			return
		}
		g.Wake(id)
	}
}

// onReceiptNotify pushes the receipts a ReceiptChannel notification
// carries. Called from the notifier's goroutine.
func (g *Gateway) onReceiptNotify(payload string, _ uint32) {
	for _, r := range parseReceiptNote(payload) {
		g.Receipt(r.chatID, r.upto, r.at)
	}
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
func (g *Gateway) Offer(received bool, ms []chat.Message) {
	if len(ms) == 0 {
		return
	}
	g.mu.Lock()
	for _, m := range ms {
		if _, ok := g.rooms[m.ChatID]; !ok || !g.running {
			continue
		}
		if g.offered == nil {
			g.offered = make(map[int64]*roomRows, len(ms)) // sized once: rooms ≤ rows
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

// OfferApplied is the worker's inbox.Config.AfterCommit when the gateway is
// in the same process (whose inbox NOTIFYs it then ignores): it offers the
// stored messages the handler returned, and wakes the room of any delivery
// without one (a handler that returns no row, such as the lab's fault
// wrapper), so that it is read as the ignored NOTIFY would have made it.
func (g *Gateway) OfferApplied(applied []inbox.Applied) {
	ms := make([]chat.Message, 0, len(applied))
	for _, a := range applied {
		switch a.Value.(type) {
		case chat.Change, chat.ReadMark:
			continue // their NOTIFYs reach the gateway (changes.go)
		}
		if r, ok := a.Value.(chat.Receipt); ok {
			for _, c := range r.Chats {
				g.Receipt(c.ChatID, c.UptoSeq, r.ReceivedAt)
			}
			continue
		}
		if m, ok := a.Value.(chat.Message); ok {
			ms = append(ms, m)
		} else if m, err := chat.DecodeEvent(a.Delivery.Payload); err == nil {
			g.Wake(m.ChatID)
		} else {
			g.WakeAll()
		}
	}
	g.Offer(true, ms)
}

// Receipt tells the room chatID's subscribers that this service's messages
// up to seq upto were delivered at at (a receipt frame, see ReceiptFrame).
// Receipts of one room that arrive before the gateway pushes them collapse
// into the highest. A room without subscribers drops it (a new subscriber
// gets the watermark when its socket opens). Never blocks; safe for
// concurrent use.
func (g *Gateway) Receipt(chatID, upto int64, at time.Time) { g.note(&g.receipts, chatID, upto, at) }

// note records upto (at at) as the room chatID's pending watermark in
// *notes (made on first use) when it is above the one pending there, for a
// room with subscribers of a running gateway, and wakes the pusher: the
// collapsing of Receipt and Read.
func (g *Gateway) note(notes *map[int64]receiptNote, chatID, upto int64, at time.Time) {
	g.mu.Lock()
	if _, ok := g.rooms[chatID]; ok && g.running {
		if *notes == nil {
			*notes = map[int64]receiptNote{}
		}
		if r, ok := (*notes)[chatID]; !ok || r.upto < upto {
			(*notes)[chatID] = receiptNote{chatID: chatID, upto: upto, at: at}
		}
	}
	g.mu.Unlock()
	g.signal()
}

// pushReceipts hands the pending receipt frames to their rooms'
// subscribers; a subscriber whose buffer is full is evicted, as for
// messages. Called by the gateway goroutine only.
func (g *Gateway) pushReceipts() {
	g.mu.Lock()
	rs := g.receipts
	g.receipts = nil
	var subs map[int64][]*Subscription
	for id := range rs {
		for s := range g.rooms[id] {
			if subs == nil {
				subs = map[int64][]*Subscription{}
			}
			subs[id] = append(subs[id], s)
		}
	}
	g.mu.Unlock()
	for id, r := range rs {
		b, err := json.Marshal(chat.ReceiptFrame{ChatID: id, From: g.service, UptoSeq: r.upto, DeliveredAt: r.at})
		if err != nil {
			continue
		}
		for _, s := range subs[id] {
			s.offer(b)
		}
	}
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
	c := make(chan []byte, min(g.cfg.ClientBuffer, subscriberChan))
	ev := make(chan struct{})
	s := &Subscription{C: c, Evicted: ev, g: g, chatID: chatID, c: c, evicted: ev, closed: make(chan struct{}),
		limit: g.cfg.ClientBuffer, cur: cursor{sent: afterSent, recv: afterReceived}}
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
		close(s.closed)
	})
}

// offer queues frame b for the subscriber, in order after the frames
// queued before; it evicts the subscriber and returns false when that
// would put it more than ClientBuffer frames behind. Called by the gateway
// goroutine only (the one producer, which is what lets the fast path skip
// the lock: only this goroutine sets pumping).
func (s *Subscription) offer(b []byte) bool {
	if !s.pumping.Load() {
		select {
		case s.c <- b:
			return true
		default:
		}
	}
	s.mu.Lock()
	if cap(s.c)+len(s.backlog) >= s.limit {
		s.mu.Unlock()
		s.evict()
		return false
	}
	s.backlog = append(s.backlog, b)
	if !s.pumping.Load() {
		s.pumping.Store(true)
		go s.pump()
	}
	s.mu.Unlock()
	return true
}

// pump moves the backlog into the channel, oldest first, as the subscriber
// reads, and ends when the backlog is empty (releasing its memory) or the
// subscription is closed.
func (s *Subscription) pump() {
	for {
		s.mu.Lock()
		if len(s.backlog) == 0 {
			s.backlog = nil
			s.pumping.Store(false)
			s.mu.Unlock()
			return
		}
		b := s.backlog[0]
		s.backlog[0] = nil
		s.backlog = s.backlog[1:]
		s.mu.Unlock()
		select {
		case s.c <- b:
		case <-s.closed:
			return
		}
	}
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
	// hold fires when the earliest gap hold ends, so held messages are
	// pushed GapTimeout after the gap was seen, not up to a PollInterval
	// later.
	hold := time.NewTimer(time.Hour)
	hold.Stop()
	defer hold.Stop()
	var holdAt time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.wake:
		case <-tick.C:
			g.mu.Lock()
			g.allDirty = true
			g.mu.Unlock()
		case <-hold.C:
			holdAt = time.Time{}
			g.mu.Lock()
			g.allDirty = true
			g.mu.Unlock()
		}
		more, h, err := g.push(ctx)
		if !h.IsZero() && (holdAt.IsZero() || h.Before(holdAt)) {
			holdAt = h
			hold.Reset(time.Until(h))
		}
		g.pushReceipts()
		g.pushChanges(ctx)
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
	sent, recv []chat.Message
	// sentFloor and recvFloor are each origin's floor, from a read (0 for
	// offered rows: nothing is skipped for them).
	sentFloor, recvFloor int64
	frames               frameSet // encoded Messages
}

// frameSet holds the encoded frames of a room's rows by message: a slice
// searched in order while there are few (a live push has one or two rows
// per room; a map per room and push was most of the push's allocations),
// a map once there are more (a catch-up read of up to a page).
type frameSet struct {
	few  []keyedFrame
	many map[frameKey][]byte
}

type keyedFrame struct {
	k frameKey
	b []byte
}

// frameSetFew is the most frames a frameSet searches in order.
const frameSetFew = 16

// get returns the frame of k, if any.
func (fs *frameSet) get(k frameKey) ([]byte, bool) {
	if fs.many != nil {
		b, ok := fs.many[k]
		return b, ok
	}
	for i := range fs.few {
		if fs.few[i].k == k {
			return fs.few[i].b, true
		}
	}
	return nil, false
}

// lookup returns the frame of k, nil if none.
func (fs *frameSet) lookup(k frameKey) []byte {
	b, _ := fs.get(k)
	return b
}

// put sets the frame of k, which get does not have yet; n is how many
// frames the set may end up with (a capacity hint).
func (fs *frameSet) put(k frameKey, b []byte, n int) {
	switch {
	case fs.many != nil:
		fs.many[k] = b
	case len(fs.few) < frameSetFew:
		if fs.few == nil {
			fs.few = make([]keyedFrame, 0, min(n, frameSetFew))
		}
		fs.few = append(fs.few, keyedFrame{k, b})
	default:
		fs.many = make(map[frameKey][]byte, max(n, 2*frameSetFew))
		for _, f := range fs.few {
			fs.many[f.k] = f.b
		}
		fs.few = nil
		fs.many[k] = b
	}
}

// frameKey names one message of a room: its origin and id (an id is unique
// per origin only; a faulty or forged peer could reuse one of ours).
type frameKey struct {
	from string
	id   string
}

// encode encodes every row's frame once, however many subscribers the
// room has, and drops (and logs) the rows that cannot be encoded: a cursor
// must not move past a message it could not push. The dropped message is a
// gap to its subscribers (held, then pushed past, for received messages)
// and stays in the history. enc is json.Marshal but for tests.
func (rr *roomRows) encode(log *slog.Logger, enc func(chat.Message) ([]byte, error)) {
	n := len(rr.sent) + len(rr.recv)
	keep := func(ms []chat.Message) []chat.Message {
		return slices.DeleteFunc(ms, func(m chat.Message) bool {
			k := frameKey{m.From, m.ID}
			if _, ok := rr.frames.get(k); ok {
				return false
			}
			b, err := enc(m)
			if err != nil {
				log.Error("message cannot be encoded; not pushed live", "chat_id", m.ChatID, "seq", m.Seq, "from", m.From, "err", err)
				return true
			}
			rr.frames.put(k, b, n)
			return false
		})
	}
	rr.sent, rr.recv = keep(rr.sent), keep(rr.recv)
}

// push delivers Offer's rows where it can, then reads the dirty rooms from
// their subscribers' lowest cursors (those holding a gap apart) and hands
// each subscriber what it has not seen. It reports whether to read again at
// once (a page came back full and some subscriber of its room moved on) and
// the earliest end of a gap hold among the subscribers it delivered to
// (zero: none).
func (g *Gateway) push(ctx context.Context) (more bool, hold time.Time, err error) {
	g.mu.Lock()
	var ids, afterSent, afterRecv []int64
	subs := map[int64][]*Subscription{}
	// The offered rooms' subscriber lists share one growing array (each
	// list capped at its length), not an allocation per room.
	var listed []*Subscription
	offered := g.offered
	g.offered = nil
	for id, room := range g.rooms {
		if _, ok := g.dirty[id]; !ok && !g.allDirty {
			if rr := offered[id]; rr != nil {
				from := len(listed)
				for s := range room {
					listed = append(listed, s)
				}
				subs[id] = listed[from:len(listed):len(listed)]
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
			ms = min(ms, s.cur.sent)
			if s.cur.holding() {
				holders = append(holders, s.cur.recv)
			} else {
				mr = min(mr, s.cur.recv)
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
	if len(offered) > 0 {
		marked, h := g.pushOffered(offered, subs)
		hold = h
		if marked {
			g.signal() // some rooms need a read after all
		}
	}
	if len(ids) == 0 {
		return false, hold, nil
	}
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rows, err := g.pool.Query(qctx, g.query, ids, afterSent, afterRecv, g.service)
	if err != nil {
		g.markDirty(ids)
		return false, hold, err
	}
	byRoom := map[int64]*roomRows{}
	type pageKey struct {
		k        int64
		received bool
	}
	pages := map[pageKey]int{}
	full := map[int64]bool{} // rooms with a full page: there may be more to read
	for rows.Next() {
		var m chat.Message
		var k int64
		var received bool
		var recvAt *time.Time
		var floor int64
		var version int32
		if err := rows.Scan(&k, &m.ChatID, &received, &m.ID, &m.Seq, &m.Body, &m.SentAt, &recvAt, &m.From, &m.DeliveredAt, &m.Author, &floor, &m.TraceParent,
			&version, &m.EditedAt, &m.Deleted, &m.ReadAt); err != nil {
			rows.Close()
			g.markDirty(ids)
			return false, hold, err
		}
		m.ReceivedAt, m.Version = recvAt, int64(version)
		if pages[pageKey{k, received}]++; pages[pageKey{k, received}] == gatewayPageSize {
			full[m.ChatID] = true
		}
		rr := byRoom[m.ChatID]
		if rr == nil {
			rr = &roomRows{}
			byRoom[m.ChatID] = rr
		}
		if received {
			rr.recv, rr.recvFloor = append(rr.recv, m), max(rr.recvFloor, floor)
		} else {
			rr.sent, rr.sentFloor = append(rr.sent, m), max(rr.sentFloor, floor)
		}
	}
	if err := rows.Err(); err != nil {
		g.markDirty(ids)
		return false, hold, err
	}
	now := time.Now()
	for id, rr := range byRoom {
		rr.sent, rr.recv = bySeq(rr.sent), bySeq(rr.recv)
		rr.encode(g.log, encodeFrame)
		progress := false
		for _, s := range subs[id] {
			before := s.cur.progress()
			// A held gap is looked at again when its hold ends (holdUntil),
			// at the next tick, which reads every room, or when the room is
			// woken.
			if g.deliver(s, rr, now) {
				hold = earliest(hold, s.cur.holdUntil(g.cfg.GapTimeout))
			}
			// A subscriber that starts holding has moved on too: it gets a
			// read of its own from now on, and the others theirs.
			progress = progress || s.cur.progress() != before
		}
		if full[id] && progress {
			// Read on at once. A full page nobody could take (everything
			// in it is held behind a gap) waits for the tick instead of
			// being read again and again.
			more = true
			g.markDirty([]int64{id})
		}
	}
	return more, hold, nil
}

// pushOffered delivers Offer's rows of rooms that need no read, room by room:
// only if every subscriber of the room can take them in seq order from its
// cursors; otherwise the room is marked dirty (the caller signals another
// push, which reads it). It reports whether it marked any, and the earliest
// end of a gap hold among the subscribers it delivered to.
func (g *Gateway) pushOffered(offered map[int64]*roomRows, subs map[int64][]*Subscription) (marked bool, hold time.Time) {
	now := time.Now()
	for id, rr := range offered {
		ss := subs[id]
		if len(ss) == 0 {
			continue // the room emptied (or was read) meanwhile
		}
		rr.sent, rr.recv = bySeq(rr.sent), bySeq(rr.recv)
		rr.encode(g.log, encodeFrame)
		ok := true
		for _, s := range ss {
			if !s.cur.takes(rr.sent, rr.recv) {
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
			// again when the hold ends, at the next tick, which reads every
			// room, or when the room is woken.
			if g.deliver(s, rr, now) {
				hold = earliest(hold, s.cur.holdUntil(g.cfg.GapTimeout))
			}
			if len(rr.sent) > 0 && s.cur.sent < rr.sent[len(rr.sent)-1].Seq {
				// A gap inside the offered sends (another process's send
				// between two of ours): read the room now.
				g.markDirty([]int64{id})
				marked = true
			}
		}
	}
	return marked, hold
}

// bySeq sorts ms by seq and drops repeated seqs (a room read from two
// cursors returns the rows above the higher one twice).
func bySeq(ms []chat.Message) []chat.Message {
	// slices.SortFunc, unlike sort.Slice, allocates nothing (no swapper, no
	// closure on the heap); rows come mostly sorted already.
	slices.SortFunc(ms, func(a, b chat.Message) int { return cmp.Compare(a.Seq, b.Seq) })
	return slices.CompactFunc(ms, func(a, b chat.Message) bool { return a.Seq == b.Seq })
}

func (g *Gateway) markDirty(ids []int64) {
	g.mu.Lock()
	for _, id := range ids {
		g.dirty[id] = struct{}{}
	}
	g.mu.Unlock()
}

// deliver queues to s the rows of rr after its cursor (cursor.advance) and
// reports whether received rows are held back behind a seq gap. Rows whose
// frame cannot be encoded were dropped from rr beforehand (roomRows.encode),
// so the cursor never moves past a message it did not push.
func (g *Gateway) deliver(s *Subscription, rr *roomRows, now time.Time) (held bool) {
	s.cur.skipDeleted(rr.sent, rr.recv, rr.sentFloor, rr.recvFloor)
	out, held, notes := s.cur.advance(rr.sent, rr.recv, now, g.cfg.GapTimeout)
	for _, n := range notes {
		if n.pushedPast {
			g.log.Warn("pushing past a missing message", "chat_id", s.chatID, "missing_seq", n.missing, "next_seq", n.next)
		}
		if n.gaveUp {
			g.log.Warn("gave up on a missing message", "chat_id", s.chatID, "watermark", n.newWatermark)
		}
	}
	for _, m := range out {
		if !s.offer(rr.frames.lookup(frameKey{m.From, m.ID})) {
			return false
		}
		if m.TraceParent != "" && g.cfg.OnPush != nil {
			g.cfg.OnPush(m, now)
		}
	}
	return held
}

// encodeFrame is a frame's encoding: the Message as JSON, exactly what
// json.Marshal(m) gives. MarshalJSON is called directly: json.Marshal would
// only scan its output again to validate and compact it, and copy it.
func encodeFrame(m chat.Message) ([]byte, error) { return m.MarshalJSON() }

// earliest returns the earlier of two times, a zero one meaning none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

func (s *Subscription) evict() {
	select {
	case <-s.evicted:
	default:
		close(s.evicted)
	}
	s.Close()
}
