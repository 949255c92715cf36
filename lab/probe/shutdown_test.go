package probe

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/lab/env"
	"github.com/outboxchat/outboxchat/lab/process"
)

// shutdownLoad is the closed-loop load of TestSIGTERMMidLoad: senders POST
// to the consumers service with an idempotency key each. A transport error
// (the process is stopping or restarting) is retried with the same key
// until the send is answered; a 5xx is recorded and not retried, so the
// test can check that it stored nothing.
type shutdownLoad struct {
	base   string
	chats  int64
	sender *Sender // bearer token and the client's timeout

	mu       sync.Mutex
	ok       map[string]chat.Message // key → message answered 201 or 200
	created  int                     // 201 answers
	fiveXX   []string                // keys answered 5xx
	retries  int                     // transport errors retried
	failures []string                // anything unexpected
	okCount  atomic.Int64
}

func (l *shutdownLoad) run(ctx context.Context, sender int, stop <-chan struct{}) {
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		default:
		}
		key := fmt.Sprintf("sigterm-%d-%d", sender, i)
		chatID := int64(i)%l.chats + 1
		l.sendOne(ctx, chatID, key)
	}
}

func (l *shutdownLoad) sendOne(ctx context.Context, chatID int64, key string) {
	body := []byte(fmt.Sprintf(`{"body": "msg %s"}`, key))
	for ctx.Err() == nil {
		code, data, err := l.sender.post(ctx, l.base, chatID, key, body)
		if err != nil {
			// Refused or reset while the process stops or restarts: the
			// outcome is unknown, so send again with the same key.
			l.mu.Lock()
			l.retries++
			l.mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond): // retry pause, not a synchronisation
			}
			continue
		}
		l.mu.Lock()
		switch {
		case code == http.StatusCreated || code == http.StatusOK:
			var m chat.Message
			if err := json.Unmarshal(data, &m); err != nil || m.ID == "" {
				l.failures = append(l.failures, fmt.Sprintf("%s: %d with body %q", key, code, data))
			} else {
				l.ok[key] = m
				if code == http.StatusCreated {
					l.created++
				}
				l.okCount.Add(1)
			}
		case code >= 500:
			l.fiveXX = append(l.fiveXX, key)
		default:
			l.failures = append(l.failures, fmt.Sprintf("%s: %d %s", key, code, data))
		}
		l.mu.Unlock()
		return
	}
}

// waitOK waits until n sends were answered, at most until ctx ends.
func (l *shutdownLoad) waitOK(ctx context.Context, t *testing.T, n int64) {
	t.Helper()
	if err := env.WaitFor(ctx, 20*time.Millisecond, func() bool { return l.okCount.Load() >= n }); err != nil {
		t.Fatalf("only %d sends answered, want %d: %v", l.okCount.Load(), n, err)
	}
}

// readyzProbe polls GET /readyz every 5 ms, as a load balancer would, and
// records what it saw in order, collapsing repeats: "ready", "stopping",
// "down" (no answer), or "other <code>".
type readyzProbe struct {
	mu   sync.Mutex
	seen []string
}

func (p *readyzProbe) run(ctx context.Context, url string) {
	c := &http.Client{Timeout: time.Second}
	for ctx.Err() == nil {
		s := "down"
		if resp, err := c.Get(url + "/readyz"); err == nil {
			var b struct{ Status string }
			_ = json.NewDecoder(resp.Body).Decode(&b)
			resp.Body.Close()
			switch {
			case resp.StatusCode == 200 && b.Status == "ready":
				s = "ready"
			case resp.StatusCode == 503 && b.Status == "stopping":
				s = "stopping"
			default:
				s = fmt.Sprintf("other %d %s", resp.StatusCode, b.Status)
			}
		}
		p.mu.Lock()
		if len(p.seen) == 0 || p.seen[len(p.seen)-1] != s {
			p.seen = append(p.seen, s)
		}
		p.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// stopGracefully sends SIGTERM to p mid-load and checks that it exited by
// itself, with status 0, well before the lab's SIGKILL.
func stopGracefully(ctx context.Context, t *testing.T, p *process.Proc) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	start := time.Now()
	if err := p.Stop(sctx); err != nil {
		t.Fatalf("SIGTERM %s: %v", p.Name(), err)
	}
	if err := p.ExitErr(); err != nil {
		t.Errorf("%s exited with %v after SIGTERM, want status 0\n%s", p.Name(), err, p.Tail())
	}
	t.Logf("%s stopped %v after SIGTERM", p.Name(), time.Since(start).Round(time.Millisecond))
}

// SIGTERM in the middle of a load, against real `outboxchat serve`
// processes, first to the consumers process (api, relay and worker roles:
// the sender side) and then to the workers process (the receiver side),
// each started again at once:
//   - /readyz answers 503 "stopping" before the port closes;
//   - a WebSocket of the stopping process is closed with 1001 (going away)
//     and the page-like watchers reconnect and catch up by their cursors;
//   - every send answered 201/200 is shown exactly once on the receiving
//     side, none twice on either side, and every row has its 201;
//   - a send answered 5xx stored nothing;
//   - each process exits 0 on its own (the relay finished its pass and the
//     worker its batch and ack within the stop budget), and at the end the
//     workers' group has nothing pending.
func TestSIGTERMMidLoad(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	e, err := env.Start(ctx, env.Options{ExtraArgs: append([]string{"--shutdown-delay", "300ms"}, env.UnlimitedArgs...)})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	checkPasswordsOffCommandLine(t, e)

	const chats = 6
	var watchers []*Watcher // per chat: one on workers (shows consumers' messages), one on consumers
	for c := int64(1); c <= chats; c++ {
		for _, base := range []string{e.WorkersURL, e.ConsumersURL} {
			w, err := NewWatcher(base, c, &WatcherConfig{Token: e.Token})
			if err != nil {
				t.Fatal(err)
			}
			if err := w.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer w.Stop(context.Background())
			watchers = append(watchers, w)
		}
	}
	for _, w := range watchers {
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		err := w.WaitConnected(wctx)
		wcancel()
		if err != nil {
			t.Fatalf("watcher not connected: %v", err)
		}
	}
	// A raw WebSocket on the consumers service, to see its close code.
	probe, _ := NewWatcher(e.ConsumersURL, 1, nil)
	conn, _, err := websocket.Dial(ctx, probe.wsURL(), wsDialOptions(e.Token))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	closed := make(chan websocket.StatusCode, 1)
	go func() {
		for {
			if _, _, err := conn.Read(ctx); err != nil {
				closed <- websocket.CloseStatus(err)
				return
			}
		}
	}()

	// A part whose Stop ran out of time was stopped hard: Serve logs
	// "stop" with the error. None may.
	var hardMu sync.Mutex
	var hard []string
	for _, p := range []*process.Proc{e.Consumers, e.Workers} {
		defer p.Subscribe(func(l process.LogLine) {
			if l.Msg == "stop" || l.Msg == "stopping with a batch not acknowledged; the queue delivers it again" {
				hardMu.Lock()
				hard = append(hard, p.Name()+": "+l.Raw)
				hardMu.Unlock()
			}
		})()
	}

	load := &shutdownLoad{base: e.ConsumersURL, chats: chats,
		sender: &Sender{client: &http.Client{Timeout: 15 * time.Second}, token: e.Token}, ok: map[string]chat.Message{}}
	stop := make(chan struct{})
	var senders sync.WaitGroup
	for i := range 6 {
		senders.Add(1)
		go func() { defer senders.Done(); load.run(ctx, i, stop) }()
	}
	stopSenders := sync.OnceFunc(func() { close(stop); senders.Wait() })
	defer stopSenders()

	load.waitOK(ctx, t, 300)
	pctx, pcancel := context.WithCancel(ctx)
	var rp readyzProbe
	probeDone := make(chan struct{})
	go func() { defer close(probeDone); rp.run(pctx, e.ConsumersURL) }()
	if err := env.WaitFor(ctx, 5*time.Millisecond, func() bool {
		rp.mu.Lock()
		defer rp.mu.Unlock()
		return len(rp.seen) > 0
	}); err != nil {
		t.Fatal(err)
	}
	stopGracefully(ctx, t, e.Consumers)
	pcancel()
	<-probeDone
	rp.mu.Lock()
	seen := fmt.Sprint(rp.seen)
	rp.mu.Unlock()
	if seen != "[ready stopping down]" {
		t.Errorf("/readyz during the stop went %s, want [ready stopping down]", seen)
	}
	select {
	case code := <-closed:
		if code != websocket.StatusGoingAway {
			t.Errorf("WebSocket of the stopped process closed with %d, want %d (going away)", code, websocket.StatusGoingAway)
		}
	case <-time.After(10 * time.Second):
		t.Error("WebSocket of the stopped process not closed")
	}
	if err := e.Consumers.StartReady(ctx); err != nil {
		t.Fatal(err)
	}

	load.waitOK(ctx, t, load.okCount.Load()+300)
	stopGracefully(ctx, t, e.Workers)
	if err := e.Workers.StartReady(ctx); err != nil {
		t.Fatal(err)
	}
	load.waitOK(ctx, t, load.okCount.Load()+300)
	stopSenders()

	hardMu.Lock()
	for _, h := range hard {
		t.Errorf("not a graceful stop: %s", h)
	}
	hardMu.Unlock()
	load.mu.Lock()
	defer load.mu.Unlock()
	for _, f := range load.failures {
		t.Error(f)
	}
	// Every answered send is shown on the workers side, once.
	want := map[int64]map[int64]string{} // chat → seq → id
	for _, m := range load.ok {
		if want[m.ChatID] == nil {
			want[m.ChatID] = map[int64]string{}
		}
		want[m.ChatID][m.Seq] = m.ID
	}
	dctx, dcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer dcancel()
	missing := func() int {
		n := 0
		for i := 0; i < len(watchers); i += 2 {
			w := watchers[i] // on workers
			seen := w.Seen(chat.Consumers)
			for seq, id := range want[w.chatID] {
				if s, ok := seen[seq]; !ok || s.Message.ID != id {
					n++
				}
			}
		}
		return n
	}
	if err := env.WaitFor(dctx, 50*time.Millisecond, func() bool { return missing() == 0 }); err != nil {
		t.Errorf("%d of %d answered sends not shown on the workers side", missing(), len(load.ok))
	}
	for _, w := range watchers {
		if d := w.Duplicates(); d > 0 {
			t.Errorf("chat %d on %s: %d messages shown twice", w.chatID, w.base, d)
		}
		if v := w.OrderViolations(); len(v) > 0 {
			t.Errorf("chat %d on %s: order violations %v", w.chatID, w.base, v)
		}
		if w.Connects() < 2 {
			t.Errorf("chat %d on %s: %d connections, want a reconnect after the stop", w.chatID, w.base, w.Connects())
		}
	}
	// Every row has its 201, and no 5xx left a row.
	var rows, fiveXXRows, inbox int
	admin := e.Admin()
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM consumers.messages`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM consumers.messages WHERE client_id = ANY($1)`, load.fiveXX).Scan(&fiveXXRows); err != nil {
		t.Fatal(err)
	}
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM workers.inbox`).Scan(&inbox); err != nil {
		t.Fatal(err)
	}
	if rows != len(load.ok) || fiveXXRows != 0 || inbox != len(load.ok) {
		t.Errorf("rows %d, workers inbox %d, answered sends %d, rows of sends answered 5xx %d (of %d): want rows = inbox = answered, no 5xx row",
			rows, inbox, len(load.ok), fiveXXRows, len(load.fiveXX))
	}
	// The workers acknowledged everything they took.
	stream := env.QueueKeys(chat.Consumers).Stream
	if err := env.WaitFor(dctx, 50*time.Millisecond, func() bool {
		p, err := e.RedisClient().XPending(ctx, stream, chat.Workers).Result()
		return err == nil && p.Count == 0
	}); err != nil {
		p, _ := e.RedisClient().XPending(ctx, stream, chat.Workers).Result()
		t.Errorf("workers group still has pending entries: %+v", p)
	}
	t.Logf("answered %d (%d created), 5xx %d, transport errors retried %d", len(load.ok), load.created, len(load.fiveXX), load.retries)
}

// checkPasswordsOffCommandLine fails t if a service process's command line
// (/proc/PID/cmdline, which any user's ps reads) holds its Redis URL's
// password, or if its environment (the owner's only) lacks the URL serve
// reads instead.
func checkPasswordsOffCommandLine(t *testing.T, e *env.Env) {
	t.Helper()
	for _, p := range []*process.Proc{e.Consumers, e.Workers} {
		service := p.Name()
		u, err := url.Parse(e.ServiceRedisURL(service))
		if err != nil {
			t.Fatal(err)
		}
		pw, ok := u.User.Password()
		if !ok || pw == "" {
			t.Fatalf("%s: Redis URL without a password; the check needs one", service)
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.PID()))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(cmdline, []byte(pw)) {
			shown := bytes.ReplaceAll(bytes.ReplaceAll(cmdline, []byte(pw), []byte("xxxxx")), []byte{0}, []byte{' '})
			t.Errorf("%s: the command line shows the Redis password (xxxxx here): %s", service, shown)
		}
		environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", p.PID()))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(strings.Split(string(environ), "\x00"), "REDIS_URL="+e.ServiceRedisURL(service)) {
			t.Errorf("%s: no REDIS_URL with the service's URL in the environment", service)
		}
		// The log's start line shows how the process was started, the
		// environment's URLs too, without the password.
		log, err := os.ReadFile(filepath.Join(e.Dir, service+".log"))
		if err != nil {
			t.Fatal(err)
		}
		start, _, _ := bytes.Cut(log, []byte("\n"))
		redacted := "REDIS_URL=" + strings.Replace(e.ServiceRedisURL(service), ":"+pw+"@", ":xxxxx@", 1)
		if bytes.Contains(start, []byte(pw)) || !bytes.Contains(start, []byte(redacted)) {
			t.Errorf("%s: log start line %q: want %s in it and no password", service, bytes.ReplaceAll(start, []byte(pw), []byte("<password>")), redacted)
		}
	}
}
