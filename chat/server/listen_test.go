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

	before := triggers(t, relay)
	const n = 10
	for i := 1; i <= n; i++ {
		chattest.Send(t, cons.base, chatID, fmt.Sprint("after ", i))
		w.WaitSeqs(t, chat.Consumers, total+i, 20*time.Second)
	}
	got := triggers(t, relay)
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
