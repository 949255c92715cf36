package server

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/internal/notifier"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/outbox"
)

// gathered returns the value of the counter or gauge name whose labels
// include labels (name=value pairs), summed over the series that match; -1
// when none does.
func gathered(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	v, found := 0.0, false
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				ok := false
				for _, l := range m.GetLabel() {
					ok = ok || (l.GetName() == labels[i] && l.GetValue() == labels[i+1])
				}
				if !ok {
					continue series
				}
			}
			found = true
			v += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	if !found {
		return -1
	}
	return v
}

// triggers reads the consumers relay's rows published by each trigger.
func triggers(t testing.TB, g prometheus.Gatherer) map[outbox.WakeTrigger]float64 {
	t.Helper()
	out := map[outbox.WakeTrigger]float64{}
	for _, tr := range []outbox.WakeTrigger{outbox.TriggerNotify, outbox.TriggerWake, outbox.TriggerCatchUp, outbox.TriggerPoll, outbox.TriggerRetry} {
		out[tr] = gathered(t, g, "outboxchat_relay_published_by_trigger_total", "trigger", string(tr))
	}
	return out
}

// countedAtLeast waits until the relay's published-by-trigger counters
// add up to at least want rows and returns them.
func countedAtLeast(t testing.TB, g prometheus.Gatherer, want float64) map[outbox.WakeTrigger]float64 {
	t.Helper()
	var got map[outbox.WakeTrigger]float64
	testenv.WaitFor(t, 20*time.Second, fmt.Sprintf("the relay counting %v rows", want), func() bool {
		got = triggers(t, g)
		var sum float64
		for _, v := range got {
			sum += v
		}
		return sum >= want
	})
	return got
}

// steadySender sends to chatID through base, one send after another, until
// stopped: each send is retried with its Idempotency-Key until it gets 201,
// so that a send that failed while Postgres was away, or whose commit went
// unanswered, is stored once all the same.
type steadySender struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	sent int
	err  error
}

func startSteadySender(base string, chatID int64) *steadySender {
	s := &steadySender{stop: make(chan struct{}), done: make(chan struct{})}
	client := &http.Client{Transport: chattest.BearerTransport{}, Timeout: 10 * time.Second}
	go func() {
		defer close(s.done)
		for i := 1; ; i++ {
			key, body := fmt.Sprintf("steady-%d", i), fmt.Sprintf(`{"body":"steady %d"}`, i)
			for {
				select {
				case <-s.stop:
					return
				default:
				}
				req, _ := http.NewRequest(http.MethodPost, fmt.Sprintf("%s/api/chats/%d/messages", base, chatID), strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", key)
				code, raw, err := chattest.Answer(client.Do(req))
				if err == nil && code == http.StatusCreated {
					break
				}
				if err == nil && code < 500 && code != http.StatusTooManyRequests {
					s.mu.Lock()
					s.err = fmt.Errorf("send %s: %d %s", key, code, raw)
					s.mu.Unlock()
					return
				}
				// Postgres is away (503) or the answer was lost: the same
				// key again, after a moment, so as not to spin.
				select {
				case <-s.stop:
					// Stopped mid-retry: the last send's fate is unknown;
					// one more try settles it (stored once either way).
					s.settle(client, req.URL.String(), key, body)
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
			s.mu.Lock()
			s.sent = i
			s.mu.Unlock()
		}
	}()
	return s
}

// settle resends key until it is answered 201 (at most 30 s), so that the
// count of stored messages is known.
func (s *steadySender) settle(client *http.Client, u, key, body string) {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		if code, _, err := chattest.Answer(client.Do(req)); err == nil && code == http.StatusCreated {
			s.mu.Lock()
			s.sent++
			s.mu.Unlock()
			return
		}
		<-time.After(20 * time.Millisecond)
	}
	s.mu.Lock()
	s.err = fmt.Errorf("send %s: not stored within 30 s", key)
	s.mu.Unlock()
}

// count returns how many sends were stored so far.
func (s *steadySender) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sent
}

// finish stops the sender and returns how many of its sends were stored.
func (s *steadySender) finish(t testing.TB) int {
	t.Helper()
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		t.Fatal(s.err)
	}
	return s.sent
}

// listenComesBack runs the consumers' relay in a process of its own (so
// that every send reaches it by NOTIFY, nothing wakes it directly), cuts
// its LISTEN connection with cut under steady sends, and checks by the
// relay's counters that once it has reconnected every delivery is woken by
// a NOTIFY, none by the poll; and that every message arrives once, in
// order.
func listenComesBack(t *testing.T, h *harness, chatID int64, cut func(t *testing.T)) {
	regs := make(chan prometheus.Gatherer, 1)
	cons := h.start(chat.Consumers, func(c *Config) { c.Roles = []string{RoleAPI, RoleWorker} })
	h.start(chat.Consumers, func(c *Config) {
		c.Roles = []string{RoleRelay}
		// Long enough that a poll pass never runs while sends flow (each
		// pass resets it), short enough to carry the rows if NOTIFY did
		// not: then the poll counter shows it.
		c.Relay.PollInterval = 2 * time.Second
		c.gatherer = func(g prometheus.Gatherer) { regs <- g }
	})
	work := h.start(chat.Workers, nil)
	relay := <-regs
	w := chattest.Watch(t, work.base, chatID)
	testenv.WaitFor(t, 20*time.Second, "the relay listening", func() bool {
		return gathered(t, relay, "outboxchat_relay_listening") == 1
	})
	for i := 1; i <= 3; i++ {
		chattest.Send(t, cons.base, chatID, fmt.Sprint("before ", i))
	}
	w.WaitSeqs(t, chat.Consumers, 3, 20*time.Second)

	steady := startSteadySender(cons.base, chatID)
	testenv.WaitFor(t, 20*time.Second, "steady sends flowing", func() bool { return steady.count() >= 5 })
	cut(t)
	testenv.WaitFor(t, 60*time.Second, "the relay's LISTEN connection back", func() bool {
		return gathered(t, relay, "outboxchat_listen_reconnects_total") >= 1 &&
			gathered(t, relay, "outboxchat_relay_listening") == 1
	})
	after := steady.count()
	testenv.WaitFor(t, 60*time.Second, "steady sends flowing after the reconnect", func() bool { return steady.count() >= after+5 })
	total := 3 + steady.finish(t)
	w.WaitSeqs(t, chat.Consumers, total, 60*time.Second)

	// A row is shown at the workers before the relay's pass that published
	// it has committed and counted it: wait until every row so far is
	// counted, and below until the n new ones are.
	before := countedAtLeast(t, relay, float64(total))
	const n = 10
	for i := 1; i <= n; i++ {
		chattest.Send(t, cons.base, chatID, fmt.Sprint("after ", i))
		w.WaitSeqs(t, chat.Consumers, total+i, 20*time.Second)
	}
	got := countedAtLeast(t, relay, float64(total+n))
	if d := got[outbox.TriggerNotify] - before[outbox.TriggerNotify]; d != n {
		t.Errorf("rows published by a NOTIFY after the reconnect = %v, want %d (before %v, after %v)", d, n, before, got)
	}
	if d := got[outbox.TriggerPoll] - before[outbox.TriggerPoll]; d != 0 {
		t.Errorf("rows published by the poll after the reconnect = %v, want 0 (before %v, after %v)", d, before, got)
	}
}

func TestListenBackendsTerminatedWokenByNotifyAgain(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	listenComesBack(t, h, 61, func(t *testing.T) {
		var n int
		err := h.Admin.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = $1`, notifier.DefaultApplicationName).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Fatal("no LISTEN backend to terminate")
		}
	})
}

// The same across a restart of Postgres (a private server: the others'
// tests go on).
func TestPostgresRestartWokenByNotifyAgain(t *testing.T) {
	t.Parallel()
	srv := testenv.PrivatePostgres(t)
	h := newHarnessOn(t, srv.AdminURL(), "")
	listenComesBack(t, h, 62, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := srv.Restart(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// deployment starts both services for wakeEveryKind and returns their API
// bases and the registries of the processes that run their relays.
type deployment func(t *testing.T, h *harness) (cons, work string, consRelay, workRelay prometheus.Gatherer)

// allInOne runs every role of a service in one process: its own sends,
// edits, deletes, read marks and receipts wake its relay directly.
func allInOne(parts int) deployment {
	return func(t *testing.T, h *harness) (string, string, prometheus.Gatherer, prometheus.Gatherer) {
		start := func(service string) (*running, prometheus.Gatherer) {
			reg := make(chan prometheus.Gatherer, 1)
			r := h.start(service, func(c *Config) {
				c.Partitions, c.Relay.PollInterval = parts, 2*time.Second
				c.gatherer = func(g prometheus.Gatherer) { reg <- g }
			})
			return r, <-reg
		}
		cons, cr := start(chat.Consumers)
		work, wr := start(chat.Workers)
		return cons.base, work.base, cr, wr
	}
}

// split runs each service's relay in a process of its own, beside one
// with the api and worker roles: every wake-up is a NOTIFY.
func split(parts int) deployment {
	return func(t *testing.T, h *harness) (string, string, prometheus.Gatherer, prometheus.Gatherer) {
		start := func(service string) (*running, prometheus.Gatherer) {
			reg := make(chan prometheus.Gatherer, 1)
			h.start(service, func(c *Config) {
				c.Roles, c.Partitions, c.Relay.PollInterval = []string{RoleRelay}, parts, 2*time.Second
				c.gatherer = func(g prometheus.Gatherer) { reg <- g }
			})
			return h.start(service, func(c *Config) { c.Roles, c.Partitions = []string{RoleAPI, RoleWorker}, parts }), <-reg
		}
		cons, cr := start(chat.Consumers)
		work, wr := start(chat.Workers)
		return cons.base, work.base, cr, wr
	}
}

// wakeEveryKind checks that every kind of change reaches the other side
// woken, not polled: in each chat (one per partition) a message each way,
// its receipt, an edit, a delete and a read mark each way, every one
// awaited at the other side before the next; then no relay published a row
// on its poll (2 s: a change left to it would wait for it, nothing else
// would publish it first), and the rows went by want.
func wakeEveryKind(t *testing.T, deploy deployment, chats []int64, want outbox.WakeTrigger) {
	h := newHarness(t, "")
	consBase, workBase, consRelay, workRelay := deploy(t, h)
	wait := 20 * time.Second
	for _, g := range []prometheus.Gatherer{consRelay, workRelay} {
		testenv.WaitFor(t, wait, "the relay listening", func() bool { return gathered(t, g, "outboxchat_relay_listening") == 1 })
	}
	consBefore, workBefore := triggers(t, consRelay), triggers(t, workRelay)
	tok := chattest.Token()
	for _, chatID := range chats {
		atCons, atWork := chattest.Watch(t, consBase, chatID), chattest.Watch(t, workBase, chatID)
		m := chattest.Send(t, consBase, chatID, "from consumers")
		atWork.WaitSeqs(t, chat.Consumers, 1, wait)
		testenv.WaitFor(t, wait, "✓✓ of the consumers' message", func() bool { return atCons.LastReceipt(chat.Consumers).UptoSeq == 1 })
		chattest.Send(t, workBase, chatID, "from workers")
		atCons.WaitSeqs(t, chat.Workers, 1, wait)
		testenv.WaitFor(t, wait, "✓✓ of the workers' message", func() bool { return atWork.LastReceipt(chat.Workers).UptoSeq == 1 })

		msgURL := fmt.Sprintf("%s/api/chats/%d/messages/%s", consBase, chatID, m.ID)
		if code, b := call(t, "PATCH", msgURL, tok, `{"body":"edited"}`); code != http.StatusOK {
			t.Fatalf("edit: %d %s", code, b)
		}
		testenv.WaitFor(t, wait, "the edit at the workers' client", func() bool { return len(atWork.Typed("edit")) == 1 })
		if code, b := call(t, "DELETE", msgURL, tok, ""); code != http.StatusOK {
			t.Fatalf("delete: %d %s", code, b)
		}
		testenv.WaitFor(t, wait, "the delete at the workers' client", func() bool { return len(atWork.Typed("delete")) == 1 })
		for _, r := range []struct {
			reader, base string
			at           *chattest.Watcher
		}{{chat.Workers, workBase, atCons}, {chat.Consumers, consBase, atWork}} {
			if code, b := call(t, "POST", fmt.Sprintf("%s/api/chats/%d/read", r.base, chatID), tok, `{"upto_seq":1}`); code != http.StatusOK {
				t.Fatalf("%s read: %d %s", r.reader, code, b)
			}
			testenv.WaitFor(t, wait, "the "+r.reader+" read mark at the other side", func() bool { return len(r.at.Typed("read")) == 1 })
		}
	}
	for _, r := range []struct {
		name   string
		before map[outbox.WakeTrigger]float64
		relay  prometheus.Gatherer
	}{{"consumers", consBefore, consRelay}, {"workers", workBefore, workRelay}} {
		// Each service's outbox got, per chat: a message, a receipt, a read
		// mark, and the consumers' an edit and a delete.
		rows := float64(3 * len(chats))
		if r.name == "consumers" {
			rows += float64(2 * len(chats))
		}
		// A row can reach the other side before its relay pass has counted
		// it, so wait for the counters before reading them.
		var before float64
		for _, v := range r.before {
			before += v
		}
		d := map[outbox.WakeTrigger]float64{}
		for k, v := range countedAtLeast(t, r.relay, before+rows) {
			d[k] = v - r.before[k]
		}
		if d[outbox.TriggerPoll] != 0 || d[outbox.TriggerRetry] != 0 || d[want] != rows {
			t.Errorf("%s relay: rows published by trigger %v, want all %v of them by %s", r.name, d, rows, want)
		}
	}
}

func TestEveryKindOfChangeWokenInOneProcess(t *testing.T) {
	t.Parallel()
	wakeEveryKind(t, allInOne(1), []int64{71}, outbox.TriggerWake)
}

func TestEveryKindOfChangeWokenAcrossProcesses(t *testing.T) {
	t.Parallel()
	wakeEveryKind(t, split(2), []int64{72, 73}, outbox.TriggerNotify)
}
