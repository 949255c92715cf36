package probe

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/lab/env"
)

// DefaultReconnectWait is WatcherConfig.ReconnectWait's default.
const DefaultReconnectWait = 100 * time.Millisecond

// WatcherConfig configures a Watcher. A zero field means its default.
type WatcherConfig struct {
	// OnFrame, when set, is called for every message frame from the
	// watcher's goroutine, in arrival order. It must not block for long.
	OnFrame func(Shown)
	// OnOther, when set, is called for every other frame with a "type"
	// (receipt, edit, delete, read, typing, presence, error): its type, the
	// raw frame (valid only during the call) and when it arrived, from the
	// watcher's goroutine, in arrival order. It must not block for long.
	OnOther func(typ string, frame []byte, at time.Time)
	// ReconnectWait is the pause between two connection attempts. Default
	// DefaultReconnectWait (100 ms).
	ReconnectWait time.Duration
	// Token is the bearer token offered as a WebSocket subprotocol, as the
	// chat page does ("" = none: the services run without auth).
	Token string
	// Base, when set, is called before every connection attempt for the
	// base URL to dial ("http://127.0.0.1:PORT"): a client that lands on
	// another API process of the service after each reconnect. Default
	// nil: always the URL given to NewWatcher.
	Base func() string
}

// Shown is one message frame a Watcher received.
type Shown struct {
	// Message is the frame, decoded.
	Message chat.Message
	// At is when the frame arrived.
	At time.Time
	// Duplicate is set when a frame with the same origin and seq was shown
	// before.
	Duplicate bool
	// OutOfOrder is set when the frame's seq is not greater than the last
	// seq shown from the same origin (and it is not a duplicate).
	OutOfOrder bool
	// Conn numbers the connection the frame came on (1 for the first).
	Conn int
}

// Watcher is a WebSocket client of one service's /ws for one chat, as a
// user's browser would be: it records every message frame with its arrival
// time and, when the connection drops (the service is redeployed or
// crashes), reconnects to the same URL passing its cursors (the last seq
// seen of each origin), so it gets what it missed and then live frames.
// Methods are safe for concurrent use.
type Watcher struct {
	base   string
	chatID int64
	cfg    WatcherConfig

	mu        sync.Mutex
	frames    []Shown
	first     map[string]map[int64]Shown // origin → seq → first showing
	last      map[string]int64           // origin → highest seq shown
	dups      int
	order     []string
	connected bool
	connects  int
	drop      context.CancelFunc // ends the current connection (Drop)

	cancel context.CancelFunc
	done   chan struct{}
}

// NewWatcher returns a Watcher of baseURL ("http://127.0.0.1:PORT") for chat
// chatID. It does not connect until Start.
func NewWatcher(baseURL string, chatID int64, cfg *WatcherConfig) (*Watcher, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("lab: watcher: base URL %q: want http://host:port", baseURL)
	}
	if chatID <= 0 {
		return nil, errors.New("lab: watcher: chat id must be positive")
	}
	w := &Watcher{base: strings.TrimRight(baseURL, "/"), chatID: chatID,
		first: map[string]map[int64]Shown{}, last: map[string]int64{}}
	if cfg != nil {
		w.cfg = *cfg
	}
	if w.cfg.ReconnectWait <= 0 {
		w.cfg.ReconnectWait = DefaultReconnectWait
	}
	return w, nil
}

// Start starts the connect-read-reconnect loop. It does not block; see
// WaitConnected.
func (w *Watcher) Start(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cancel != nil {
		return errors.New("lab: watcher already started")
	}
	ctx, w.cancel = context.WithCancel(context.WithoutCancel(ctx))
	w.done = make(chan struct{})
	go func() {
		defer close(w.done)
		w.loop(ctx)
	}()
	return nil
}

// Stop closes the connection and waits for the loop to end. Idempotent.
func (w *Watcher) Stop(ctx context.Context) error {
	w.mu.Lock()
	cancel, done := w.cancel, w.done
	w.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("lab: stop watcher: %w", ctx.Err())
	}
}

func (w *Watcher) wsURL() string {
	base := w.base
	if w.cfg.Base != nil {
		base = strings.TrimRight(w.cfg.Base(), "/")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	q := url.Values{}
	q.Set("chat_id", strconv.FormatInt(w.chatID, 10))
	q.Set("after_"+chat.Consumers, strconv.FormatInt(w.last[chat.Consumers], 10))
	q.Set("after_"+chat.Workers, strconv.FormatInt(w.last[chat.Workers], 10))
	return "ws" + strings.TrimPrefix(base, "http") + "/ws?" + q.Encode()
}

// wsDialOptions offers token the way the chat page does: subprotocols
// "outboxchat.v1" and "bearer.<token>" (nil without a token).
func wsDialOptions(token string) *websocket.DialOptions {
	if token == "" {
		return nil
	}
	return &websocket.DialOptions{Subprotocols: []string{"outboxchat.v1", "bearer." + token}}
}

func (w *Watcher) loop(ctx context.Context) {
	for ctx.Err() == nil {
		w.session(ctx)
		select {
		case <-ctx.Done():
		case <-time.After(w.cfg.ReconnectWait):
		}
	}
}

// session runs one connection until it drops.
func (w *Watcher) session(ctx context.Context) {
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	c, _, err := websocket.Dial(dctx, w.wsURL(), wsDialOptions(w.cfg.Token))
	cancel()
	if err != nil {
		return
	}
	defer c.CloseNow()
	c.SetReadLimit(1 << 20)
	ctx, drop := context.WithCancel(ctx)
	defer drop()
	// Reads take a ctx that is never done, and the end of ctx (Stop, Drop)
	// closes the socket: a read with a cancellable ctx makes coder/websocket
	// register a context.AfterFunc per frame, a share of the lab's CPU that
	// lab bench measures beside the services'.
	stopWatch := context.AfterFunc(ctx, func() { _ = c.CloseNow() })
	defer stopWatch()
	rctx := context.WithoutCancel(ctx)
	w.mu.Lock()
	w.connected = true
	w.connects++
	conn := w.connects
	w.drop = drop
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		w.connected = false
		w.drop = nil
		w.mu.Unlock()
	}()
	for {
		_, data, err := c.Read(rctx)
		if err != nil {
			return
		}
		at := time.Now()
		var m chat.Message
		// A frame that starts with its "type" (a receipt, a change, an
		// error...) is no message: the server writes a message's "id" first.
		if bytes.HasPrefix(data, []byte(`{"type":`)) || json.Unmarshal(data, &m) != nil || m.ID == "" || m.Seq <= 0 {
			// Not a message: a receipt, a change, an error frame...
			if on := w.cfg.OnOther; on != nil {
				var f struct {
					Type string `json:"type"`
				}
				if json.Unmarshal(data, &f) == nil && f.Type != "" {
					on(f.Type, data, at)
				}
			}
			continue
		}
		w.record(m, at, conn)
	}
}

// Drop closes the current connection, if any, as a user closing the tab
// would; the watcher reconnects after ReconnectWait with its cursors.
func (w *Watcher) Drop() {
	w.mu.Lock()
	drop := w.drop
	w.mu.Unlock()
	if drop != nil {
		drop()
	}
}

func (w *Watcher) record(m chat.Message, at time.Time, conn int) {
	s := Shown{Message: m, At: at, Conn: conn}
	w.mu.Lock()
	byseq := w.first[m.From]
	if byseq == nil {
		byseq = map[int64]Shown{}
		w.first[m.From] = byseq
	}
	if _, ok := byseq[m.Seq]; ok {
		s.Duplicate = true
		w.dups++
	} else {
		byseq[m.Seq] = s
		if m.Seq <= w.last[m.From] {
			s.OutOfOrder = true
			w.order = append(w.order, fmt.Sprintf("%s seq %d shown after seq %d", m.From, m.Seq, w.last[m.From]))
		}
	}
	if m.Seq > w.last[m.From] {
		w.last[m.From] = m.Seq
	}
	w.frames = append(w.frames, s)
	on := w.cfg.OnFrame
	w.mu.Unlock()
	if on != nil {
		on(s)
	}
}

// Connected reports whether a connection is open right now.
func (w *Watcher) Connected() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.connected
}

// Connects returns how many connections were opened so far.
func (w *Watcher) Connects() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.connects
}

// WaitConnected waits until a connection is open or ctx ends.
func (w *Watcher) WaitConnected(ctx context.Context) error {
	return env.WaitFor(ctx, 10*time.Millisecond, w.Connected)
}

// Frames returns every message frame received, in arrival order.
func (w *Watcher) Frames() []Shown {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]Shown(nil), w.frames...)
}

// Seen returns the first showing of each message from origin (a service
// name), by seq.
func (w *Watcher) Seen(origin string) map[int64]Shown {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[int64]Shown, len(w.first[origin]))
	for k, v := range w.first[origin] {
		out[k] = v
	}
	return out
}

// SeenID reports whether a message with this id was shown.
func (w *Watcher) SeenID(id string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, byseq := range w.first {
		for _, s := range byseq {
			if s.Message.ID == id {
				return true
			}
		}
	}
	return false
}

// Duplicates returns how many frames repeated an origin and seq already
// shown (a message shown twice).
func (w *Watcher) Duplicates() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.dups
}

// OrderViolations describes every frame whose seq was not above the last
// one shown from its origin (excluding duplicates).
func (w *Watcher) OrderViolations() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.order...)
}
