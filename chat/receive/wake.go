package receive

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/internal/service"
)

// DefaultWakeTimeout bounds one post-commit wake-up statement of a Waker.
const DefaultWakeTimeout = 2 * time.Second

// maxNotePayload is the largest NOTIFY payload a Waker sends, in bytes:
// Postgres refuses 8000 and more; a longer list is split into several
// notifications.
const maxNotePayload = 7900

// wakeSQL sends the notifications $1 (channels) / $2 (payloads) in one
// statement, outside any inbox transaction. The statement's own commit
// does not wait for the WAL flush (synchronous_commit=off for this
// transaction alone): a wake-up lost to a crash only delays a gateway
// until its poll, and the notify queue's lock is then held for a moment,
// not for an fsync.
const wakeSQL = `SELECT set_config('synchronous_commit', 'off', true), count(pg_notify(u.c, u.p))
	FROM unnest($1::text[], $2::text[]) AS u(c, p)`

// WakerConfig configures NewWaker. A zero field means its default.
type WakerConfig struct {
	// Timeout bounds each wake-up statement. Default DefaultWakeTimeout
	// (2 s).
	Timeout time.Duration
	// Interval is the least time between the starts of two wake-up
	// statements: what commits meanwhile rides on the next one. Default 0:
	// no spacing, the next one as soon as the previous one is done.
	Interval time.Duration
	// Logger receives failed wake-ups (Warn) with component=chat.wake.
	// Default slog.Default().
	Logger *slog.Logger
}

// Waker tells the gateways of every process of a service about inbox
// commits, after the commit and outside the inbox transaction: the chats
// that got new rows on chat.InboxChannel(service) (payload: comma-separated
// chat ids, or "" for any chat), and the receipts applied on
// chat.ReceiptChannel(service) (payload: "chat:upto:unix µs" items, comma
// separated). Committed collects and never blocks; one goroutine sends
// what was collected in one statement on the pool, and whatever commits
// meanwhile rides on the next one, so under load there is at most one
// wake-up statement in flight per process, however many batches commit.
// The wake-up is only a shortcut: Postgres stays the source of truth, and a
// gateway that misses one (a crash between commit and wake-up, a failed
// statement) finds the rows at its poll or after its LISTEN reconnects
// (catch-up by seq). Safe for concurrent use.
type Waker struct {
	pool     *pgxpool.Pool
	inbox    string
	receipt  string
	timeout  time.Duration
	interval time.Duration
	log      *slog.Logger

	mu       sync.Mutex
	chats    map[int64]struct{}
	anyChat  bool
	receipts map[int64]receiptWake
	relays   map[string]struct{}

	wake chan struct{} // 1-buffered: something is pending
	life service.Lifecycle
}

// receiptWake is the newest receipt of one chat a Waker has pending.
type receiptWake struct {
	upto int64
	at   time.Time
}

// NewWaker returns a Waker for service svc's inbox that notifies on pool.
// Errors: an unknown service (chat.ErrUnknownService), a nil pool.
func NewWaker(pool *pgxpool.Pool, svc string, cfg *WakerConfig) (*Waker, error) {
	if err := chat.CheckService(svc); err != nil {
		return nil, err
	}
	if pool == nil {
		return nil, fmt.Errorf("chat: waker: pool is required")
	}
	var c WakerConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultWakeTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return &Waker{
		pool: pool, inbox: chat.InboxChannel(svc), receipt: chat.ReceiptChannel(svc), timeout: c.Timeout, interval: c.Interval,
		log:  c.Logger.With("component", "chat.wake", "service", svc),
		wake: make(chan struct{}, 1), life: service.Lifecycle{Name: "chat: waker"},
	}, nil
}

// Committed records what an inbox commit stored (inbox.Config.AfterCommit's
// argument): the chat of each message (from the stored Message, else from
// the delivery's payload; an undecodable one wakes every chat), each
// receipt, and the chats of each seq floor (chat.EventSeqFloor). It never blocks; the wake-up follows as soon as the previous one
// is done. Calls made while the Waker is not started are kept and sent on
// Start.
func (w *Waker) Committed(applied []inbox.Applied) {
	if len(applied) == 0 {
		return
	}
	w.mu.Lock()
	for _, a := range applied {
		switch v := a.Value.(type) {
		case chat.Message:
			w.addChat(v.ChatID)
		case chat.Receipt:
			w.addReceipt(v)
		default:
			if a.Delivery.Name == chat.EventReceipt {
				if r, err := chat.DecodeReceipt(a.Delivery.Payload); err == nil {
					w.addReceipt(r)
				}
			} else if a.Delivery.Name == chat.EventSeqFloor {
				// A seq floor moved the chats' inbox floors: their rooms
				// are read again (as this process's gateway does).
				if r, err := chat.DecodeReceipt(a.Delivery.Payload); err == nil {
					for _, c := range r.Chats {
						w.addChat(c.ChatID)
					}
				} else {
					w.anyChat = true
				}
			} else if m, err := chat.DecodeEvent(a.Delivery.Payload); err == nil {
				w.addChat(m.ChatID)
			} else {
				w.anyChat = true
			}
		}
	}
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// WakeRelay asks for a wake-up of the outbox relays that LISTEN on channel
// (an empty payload, as outbox.Writer.Committed sends), in the next
// statement: for an inbox commit that enqueued an outbox event (a receipt)
// whose relay runs in another process. It never blocks; a channel pending
// twice is notified once. Safe for concurrent use.
func (w *Waker) WakeRelay(channel string) {
	w.mu.Lock()
	if w.relays == nil {
		w.relays = map[string]struct{}{}
	}
	w.relays[channel] = struct{}{}
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *Waker) addChat(id int64) {
	if w.chats == nil {
		w.chats = map[int64]struct{}{}
	}
	w.chats[id] = struct{}{}
}

func (w *Waker) addReceipt(r chat.Receipt) {
	if w.receipts == nil {
		w.receipts = map[int64]receiptWake{}
	}
	for _, c := range r.Chats {
		if cur, ok := w.receipts[c.ChatID]; !ok || c.UptoSeq >= cur.upto {
			w.receipts[c.ChatID] = receiptWake{upto: c.UptoSeq, at: r.ReceivedAt}
		}
	}
}

// take empties the pending set and returns it as notifications: channels
// and payloads, each payload under maxNotePayload bytes.
func (w *Waker) take() (channels, payloads []string) {
	w.mu.Lock()
	chats, anyChat, receipts, relays := w.chats, w.anyChat, w.receipts, w.relays
	w.chats, w.anyChat, w.receipts, w.relays = nil, false, nil, nil
	w.mu.Unlock()
	for _, ch := range slices.Sorted(maps.Keys(relays)) {
		channels, payloads = append(channels, ch), append(payloads, "")
	}
	// add appends one item (appendItem's bytes) to channel's current
	// payload in buf, first sending buf off as a payload of its own when
	// the item would take it past maxNotePayload. One buffer per
	// channel, grown in place: no item strings, no re-copying of the
	// payload built so far.
	var buf []byte
	add := func(channel string, appendItem func([]byte) []byte) {
		n := len(buf)
		if n > 0 {
			buf = append(buf, ',')
		}
		buf = appendItem(buf)
		if n > 0 && len(buf) > maxNotePayload {
			item := buf[n+1:]
			channels, payloads = append(channels, channel), append(payloads, string(buf[:n]))
			buf = append(buf[:0], item...)
		}
	}
	flush := func(channel string) {
		if len(buf) > 0 {
			channels, payloads = append(channels, channel), append(payloads, string(buf))
			buf = buf[:0]
		}
	}
	if anyChat {
		channels, payloads = append(channels, w.inbox), append(payloads, "")
	} else if len(chats) > 0 {
		ids := make([]int64, 0, len(chats))
		for id := range chats {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		for _, id := range ids {
			add(w.inbox, func(b []byte) []byte { return strconv.AppendInt(b, id, 10) })
		}
		flush(w.inbox)
	}
	if len(receipts) > 0 {
		ids := make([]int64, 0, len(receipts))
		for id := range receipts {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		for _, id := range ids {
			r := receipts[id]
			add(w.receipt, func(b []byte) []byte {
				b = strconv.AppendInt(b, id, 10)
				b = append(b, ':')
				b = strconv.AppendInt(b, r.upto, 10)
				b = append(b, ':')
				return strconv.AppendInt(b, r.at.UnixMicro(), 10)
			})
		}
		flush(w.receipt)
	}
	return channels, payloads
}

// Start starts the goroutine that sends the wake-ups. It does not block
// and follows the contract of internal/service: it runs until Stop, or
// until ctx is cancelled (a hard stop). Errors: service.ErrAlreadyStarted
// while a run is in progress, or ctx.Err() (both wrapped).
func (w *Waker) Start(ctx context.Context) error {
	return w.life.Start(ctx, func(run *service.Run) {
		run.Go(func() { w.loop(run.DrainContext(), run.Context()) })
	})
}

// Stop stops the Waker: what is pending when it is asked to stop is sent
// (bounded by Timeout), then the goroutine returns. If ctx ends first the
// statement in flight is cancelled and ctx's error returned (wrapped).
// Idempotent; nil if not running.
func (w *Waker) Stop(ctx context.Context) error { return w.life.Stop(ctx) }

// Started returns a channel closed once the latest Start succeeded.
func (w *Waker) Started() <-chan struct{} { return w.life.Started() }

// Stopped returns a channel closed once the goroutine of the latest run
// has returned (closed before the first Start).
func (w *Waker) Stopped() <-chan struct{} { return w.life.Stopped() }

// loop sends the pending wake-ups until stopping ends, then once more for
// what is pending then; each statement runs under ctx (the run's context).
func (w *Waker) loop(stopping, ctx context.Context) {
	var last time.Time // start of the previous statement
	for {
		select {
		case <-stopping.Done():
			w.send(ctx)
			return
		case <-w.wake:
		}
		if wait := time.Until(last.Add(w.interval)); w.interval > 0 && wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-stopping.Done():
				t.Stop()
				w.send(ctx)
				return
			case <-t.C:
			}
		}
		last = time.Now()
		w.send(ctx)
	}
}

// send sends what is pending in one statement.
func (w *Waker) send(ctx context.Context) {
	channels, payloads := w.take()
	if len(channels) == 0 {
		return
	}
	nctx, cancel := context.WithTimeout(ctx, w.timeout)
	_, err := w.pool.Exec(nctx, wakeSQL, channels, payloads)
	cancel()
	if err != nil && ctx.Err() == nil {
		w.log.Warn("inbox wake-up failed; other processes' gateways will read the rows at their poll",
			slog.Any("err", err))
	}
}

var _ service.Service = (*Waker)(nil)
