package torture

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/lab/env"
	"github.com/outboxchat/outboxchat/lab/probe"
	"github.com/outboxchat/outboxchat/lab/process"
)

// sentMsg is one send that got a 201: what the sender's API answered.
type sentMsg struct {
	From   string
	ID     string
	ChatID int64
	Seq    int64
}

// run is one schedule's environment and its recorders.
type run struct {
	s    *schedule
	e    *env.Env
	log  *probe.EventLog
	tap  *probe.Tap
	rng  *rand.Rand
	rmu  sync.Mutex
	mu   sync.Mutex
	sent []sentMsg
	// changed holds, per message edited or deleted, the newest version an
	// API answered 200 for (guarded by mu).
	changed map[string]chat.Message
	// clients are the WebSocket clients, by service.
	clients map[string][]*probe.Watcher
	// chats is each client's chat.
	chats map[*probe.Watcher]int64
	// locks serialise faults on one target (a process, Postgres, Redis,
	// a link).
	locks map[string]*sync.Mutex
	// keptInbox and keptStored (guarded by mu) are the inbox and messages
	// rows seen before each prune (keep): message id → row.
	keptInbox, keptStored map[string]sentMsg
}

func (t *run) intn(n int) int {
	t.rmu.Lock()
	defer t.rmu.Unlock()
	return t.rng.IntN(n)
}

// apiURLs returns the base URLs of service's API processes.
func (t *run) apiURLs(service string) []string {
	ps := []*process.Proc{t.e.Consumers}
	ps = append(ps, t.e.ConsumersAPIs...)
	if service == chat.Workers {
		ps = append([]*process.Proc{t.e.Workers}, t.e.WorkersAPIs...)
	}
	var out []string
	for _, p := range ps {
		out = append(out, p.URL())
	}
	return out
}

func (t *run) lock(target string) *sync.Mutex {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.locks[target]
	if m == nil {
		m = &sync.Mutex{}
		t.locks[target] = m
	}
	return m
}

// runSchedule runs one schedule: a fresh environment, load and clients,
// the faults, the heal, the drain and the checker.
func runSchedule(ctx context.Context, opts Options, s *schedule) (*ScheduleResult, error) {
	res := &ScheduleResult{Schedule: s.K, Topology: s.topology()}
	for _, f := range s.Faults {
		res.Faults = append(res.Faults, f.String())
	}
	links := env.NewLinks()
	defer links.Close()
	args := append([]string{"--lock-duration", lockDuration.String()}, env.UnlimitedArgs...)
	if !s.Redrive {
		args = append(args, "--redrive-after", "0")
	}
	if s.Cluster {
		// A master frozen past its failover resumes and runs the adds it
		// had queued before it learns it was replaced, then drops them:
		// only the replicas' acknowledgement tells the relay so.
		args = append(args, "--redis-replica-acks", "1")
	}
	dir := ""
	if opts.Dir != "" {
		dir = fmt.Sprintf("%s/s%d", opts.Dir, s.K)
	}
	e, err := env.Start(ctx, env.Options{APIs: s.APIs, ConsumersRelays: s.ConsumersRelays, WorkersRelays: s.WorkersRelays,
		LockDuration: lockDuration, ExtraArgs: args, Links: links, Dir: dir, RedisCluster: s.Cluster, Partitions: s.Partitions,
		Broker: map[bool]string{true: env.BrokerNATS, false: env.BrokerRedis}[s.NATS]})
	if err != nil {
		return nil, err
	}
	defer e.Close()
	t := &run{s: s, e: e, log: probe.NewEventLog(opts.Log), rng: rand.New(rand.NewPCG(uint64(s.K), 7)),
		clients: map[string][]*probe.Watcher{}, chats: map[*probe.Watcher]int64{}, locks: map[string]*sync.Mutex{}}
	t.log.Start()
	if t.tap, err = probe.StartTap(ctx, e); err != nil {
		return nil, err
	}
	defer t.tap.Stop()

	// WebSocket clients on both sides, each on one chat, dropped and
	// reconnected (to any API process of its service) at random.
	for _, svc := range []string{chat.Consumers, chat.Workers} {
		urls := t.apiURLs(svc)
		for i := range s.Clients {
			chatID := int64(1 + (i+len(t.chats))%s.Chats)
			w, err := probe.NewWatcher(urls[0], chatID, &probe.WatcherConfig{Token: e.Token, Base: func() string { return urls[t.intn(len(urls))] }})
			if err != nil {
				return nil, err
			}
			if err := w.Start(ctx); err != nil {
				return nil, err
			}
			defer w.Stop(context.Background())
			t.clients[svc] = append(t.clients[svc], w)
			t.chats[w] = chatID
		}
	}
	for _, ws := range t.clients {
		for _, w := range ws {
			if err := probe.Connect(ctx, w); err != nil {
				return nil, fmt.Errorf("lab: torture: a client could not connect: %w", err)
			}
		}
	}

	// Load, client drops and faults for opts.Duration.
	lctx, stopLoad := context.WithCancel(ctx)
	var load sync.WaitGroup
	for _, svc := range []string{chat.Consumers, chat.Workers} {
		for i := range s.Senders {
			load.Add(1)
			go func() { defer load.Done(); t.sendLoop(lctx, svc, uint64(i)) }()
		}
		for _, w := range t.clients[svc] {
			load.Add(1)
			go func() { defer load.Done(); t.dropLoop(lctx, w) }()
		}
	}
	load.Add(1)
	go func() { // invariant 4, sampled from outside while faults run
		defer load.Done()
		for env.SleepUntil(lctx, time.Now().Add(250*time.Millisecond)) == nil {
			t.tap.SampleAcks(lctx, e, t.wasInbox)
		}
	}()
	if s.Malformed > 0 {
		load.Add(1)
		go func() { defer load.Done(); t.injectMalformed(lctx, opts.Duration/2) }()
	}
	fctx, stopFaults := context.WithCancel(ctx)
	var faults sync.WaitGroup
	start := time.Now()
	for _, f := range s.Faults {
		faults.Add(1)
		go func() { defer faults.Done(); t.apply(fctx, start, f) }()
	}
	err = env.SleepUntil(ctx, start.Add(opts.Duration))
	stopFaults()
	faults.Wait()
	stopLoad()
	load.Wait()
	if err != nil {
		return nil, err
	}
	if err := t.heal(ctx); err != nil {
		return nil, err
	}

	// Drain: everything sent in the inbox and shown, outbox and streams
	// empty, within the bound.
	healed := time.Now()
	dctx, cancel := context.WithTimeout(ctx, opts.DrainBound)
	derr := env.WaitFor(dctx, 200*time.Millisecond, func() bool {
		t.tap.SampleAcks(dctx, e, t.wasInbox)
		return t.drained(dctx)
	})
	cancel()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	res.DrainS = time.Since(healed).Seconds()
	if derr != nil {
		res.Problems = append(res.Problems, fmt.Sprintf("did not drain within %v: %s", opts.DrainBound, t.drainState(ctx)))
	}
	t.check(ctx, res)
	res.OK = len(res.Problems) == 0
	if !res.OK && opts.Dir == "" {
		res.Problems = append(res.Problems, "(keep the process logs with --dir)")
	}
	return res, nil
}

// sendLoop sends to random chats of service through random API processes
// until ctx ends, recording every 201.
func (t *run) sendLoop(ctx context.Context, service string, i uint64) {
	r := rand.New(rand.NewPCG(uint64(t.s.K)*1000+i, uint64(len(service))))
	urls := t.apiURLs(service)
	snd := probe.NewSender(t.e.Token)
	n := 0
	var mine []chat.Message // this loop's sends not deleted
	for ctx.Err() == nil {
		n++
		chatID := int64(1 + r.IntN(t.s.Chats))
		m, err := snd.Send(ctx, urls[r.IntN(len(urls))], chatID, fmt.Sprintf("%s %d.%d", service, i, n))
		if err == nil {
			t.mu.Lock()
			t.sent = append(t.sent, sentMsg{From: service, ID: m.ID, ChatID: m.ChatID, Seq: m.Seq})
			t.mu.Unlock()
			mine = append(mine, m)
		}
		// Every third send also edits one of the loop's earlier messages,
		// and one in four of those deletes it instead: edits and deletes
		// go through the same faults as the sends.
		if n%3 == 0 && len(mine) > 0 {
			k := r.IntN(len(mine))
			del := r.IntN(4) == 0
			c, err := snd.Change(ctx, urls[r.IntN(len(urls))], mine[k].ChatID, mine[k].ID, fmt.Sprintf("%s %d.%d edited at %d", service, i, mine[k].Seq, n), del)
			if err == nil {
				t.mu.Lock()
				if t.changed == nil {
					t.changed = map[string]chat.Message{}
				}
				if old, ok := t.changed[c.ID]; !ok || old.Version < c.Version {
					t.changed[c.ID] = c
				}
				t.mu.Unlock()
			}
			if del && err == nil {
				mine = append(mine[:k], mine[k+1:]...)
			}
		}
		if env.SleepUntil(ctx, time.Now().Add(sendEvery)) != nil {
			return
		}
	}
}

// dropLoop closes w's connection at random moments (0.3–3 s apart).
func (t *run) dropLoop(ctx context.Context, w *probe.Watcher) {
	for {
		if env.SleepUntil(ctx, time.Now().Add(time.Duration(300+t.intn(2700))*time.Millisecond)) != nil {
			return
		}
		w.Drop()
	}
}

// injectMalformed adds s.Malformed entries that no sender wrote (no
// signature, a payload that is not an event) to each stream, after wait;
// on JetStream it retries each until it is stored or the load ends.
func (t *run) injectMalformed(ctx context.Context, wait time.Duration) {
	if env.SleepUntil(ctx, time.Now().Add(wait)) != nil {
		return
	}
	for _, from := range []string{chat.Consumers, chat.Workers} {
		for i := range t.s.Malformed {
			id := fmt.Sprintf("00000000-0000-4000-8000-%012d", i+1)
			err := probe.InjectMalformed(ctx, t.e, from, id)
			// A JetStream publish is deduplicated by its id, so it is
			// retried through a nats-server outage; an XADD is not, and a
			// timed-out one may have been applied: no retry on Redis.
			for err != nil && t.e.Broker == env.BrokerNATS && env.SleepUntil(ctx, time.Now().Add(200*time.Millisecond)) == nil {
				err = probe.InjectMalformed(ctx, t.e, from, id)
			}
			if err != nil {
				t.log.Add("lab", "could not inject a malformed entry: %v", err)
				continue
			}
			t.tap.Injected(from)
		}
	}
}
