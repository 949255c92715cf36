package lab

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/internal/labfault"
)

// Torture defaults.
const (
	// DefaultTortureSchedules is how many schedules a run draws.
	DefaultTortureSchedules = 10
	// DefaultTortureDuration is how long each schedule's load and faults
	// last, before the faults stop and the system drains.
	DefaultTortureDuration = 20 * time.Second
	// DefaultTortureDrainBound is the bound the drain must finish within,
	// from the moment the last fault was healed: every 201 send in the
	// receiver's inbox and shown to every client of its chat, outbox and
	// streams empty. Why 60 s: the slowest healing path a schedule can
	// draw is a job whose worker died holding it (handed out again after
	// the lock duration, tortureLockDuration) behind a relay that waits
	// out a frozen session (idle_in_transaction_session_timeout, 5 s) and
	// a re-drive (2 × lock duration), each of which may meet a fresh
	// reconnect backoff of the services (up to a few seconds); 60 s is
	// several times their sum and equals the gateway's gap timeout, after
	// which a client would see a held message out of order.
	DefaultTortureDrainBound = 60 * time.Second
	// tortureLockDuration is the services' lock duration in torture: short,
	// so that a stalled job comes back within a short schedule.
	tortureLockDuration = 2 * time.Second
	// tortureSendEvery is each sender goroutine's pause between sends.
	tortureSendEvery = 40 * time.Millisecond
)

// TortureOptions configures Torture. A zero field means its default.
type TortureOptions struct {
	// Schedules is how many schedules to run (1, 2, … Schedules). Default
	// DefaultTortureSchedules.
	Schedules int
	// Seed seeds every schedule's draw: schedule K of seed S is the same
	// topology, load shape and fault sequence on every run (the
	// interleaving of real processes is not). 0 means 1.
	Seed uint64
	// Only runs schedule Only of Seed alone (a replay); 0 = all.
	Only int
	// Duration is each schedule's load-and-fault phase. Default
	// DefaultTortureDuration.
	Duration time.Duration
	// DrainBound bounds each drain. Default DefaultTortureDrainBound.
	DrainBound time.Duration
	// Drop lists fault indexes (0-based, as printed) to leave out of the
	// schedule: what the shrinker does, and how to replay its result.
	Drop []int
	// Shrink re-runs a failing schedule with one fault left out at a time,
	// keeping each drop under which it still fails, and reports the faults
	// that remain.
	Shrink bool
	// Progress receives one line per schedule (and the shrinker's); Log
	// the fault events. nil discards them.
	Progress, Log io.Writer
	// Dir keeps the process logs under Dir/s<K> ("" = temp dirs, removed).
	Dir string
}

// TortureResult is the `lab torture --json` object (DESIGN.md: schedules,
// failed, lost, duplicates_shown, order_violations, max_drain_s,
// failures), plus what was drawn.
type TortureResult struct {
	// Seed is the run's seed.
	Seed uint64 `json:"seed"`
	// Schedules is how many schedules ran; Failed how many broke an
	// invariant (or could not run).
	Schedules int `json:"schedules"`
	Failed    int `json:"failed"`
	// Lost counts 201 sends missing from the receiver's inbox plus (chat,
	// side, seq) missing from a client's view once drained.
	Lost int `json:"lost"`
	// DuplicatesShown counts frames a client got twice on one connection.
	DuplicatesShown int `json:"duplicates_shown"`
	// OrderViolations counts frames that came below the last seq of their
	// side on one connection, plus stream entries added below the last
	// seq of their chat.
	OrderViolations int `json:"order_violations"`
	// MaxDrainS is the longest drain, in seconds.
	MaxDrainS float64 `json:"max_drain_s"`
	// Sent is the number of 201 answers over all schedules.
	Sent int `json:"sent"`
	// Faults counts the faults drawn, by kind.
	Faults map[string]int `json:"faults"`
	// Failures lists each failing schedule.
	Failures []TortureFailure `json:"failures"`
	// Runs is one line of figures per schedule.
	Runs []ScheduleResult `json:"runs"`
}

// TortureFailure is one failing schedule: replay it with
// `outboxchat lab torture --seed Seed --schedule Schedule`.
type TortureFailure struct {
	Seed     uint64   `json:"seed"`
	Schedule int      `json:"schedule"`
	Problems []string `json:"problems"`
	// Shrunk lists the faults the shrinker kept ("" without --shrink).
	Shrunk string `json:"shrunk,omitempty"`
}

// ScheduleResult is the outcome of one schedule: its topology and faults
// as drawn ("sigkill workers-relay @5.7s+1.1s": at 5.7 s after the load
// started, for 1.1 s), the 201 answers (Sent), the distinct messages the
// clients were shown (Shown, counting stored sends whose answer was lost),
// the clients' reconnects, the checker's counts (as in TortureResult),
// the dead letters found, the drain time in seconds, and what broke.
type ScheduleResult struct {
	Schedule        int      `json:"schedule"`
	Topology        string   `json:"topology"`
	Faults          []string `json:"faults"`
	Sent            int      `json:"sent"`
	Shown           int      `json:"shown"`
	Reconnects      int      `json:"reconnects"`
	Lost            int      `json:"lost"`
	DuplicatesShown int      `json:"duplicates_shown"`
	OrderViolations int      `json:"order_violations"`
	DeadLetters     int      `json:"dead_letters"`
	DrainS          float64  `json:"drain_s"`
	OK              bool     `json:"ok"`
	Problems        []string `json:"problems,omitempty"`
}

// Fault kinds of a schedule (besides the network kinds, NetLatency …).
const (
	faultKill       = "sigkill"     // SIGKILL a service process, restart it after a pause
	faultStop       = "sigstop"     // SIGSTOP a service process for a while, then SIGCONT
	faultTerm       = "sigterm"     // SIGTERM (graceful stop), restart after a pause
	faultCrashPoint = "crash-point" // restart with --fault KIND:SEQ: it SIGKILLs itself at that step
	faultRedisKill  = "redis-kill"  // kill -9 Redis, start it again after a pause
	faultRedisStop  = "redis-stop"  // graceful Redis shutdown, start again after a pause
	faultPgImm      = "postgres-immediate"
	faultPgFast     = "postgres-fast"
	faultNet        = "net" // a toxic on one service's link to Postgres or Redis
)

// tortureFault is one drawn fault: at At after the load starts, for For.
type tortureFault struct {
	At, For time.Duration
	Kind    string
	// Target is a process name (process kinds) or a link
	// "service>postgres|redis" (faultNet).
	Target string
	// Net is the network kind (faultNet), Stream its direction, Attrs its
	// toxiproxy attributes.
	Net    string
	Stream string
	Attrs  map[string]int
	// Crash is the --fault kind of faultCrashPoint.
	Crash string
}

func (f tortureFault) label() string {
	switch f.Kind {
	case faultNet:
		var a []string
		for _, k := range slices.Sorted(maps.Keys(f.Attrs)) {
			a = append(a, fmt.Sprintf("%s=%d", k, f.Attrs[k]))
		}
		return fmt.Sprintf("%s %s %s(%s)", f.Net, f.Target, f.Stream, strings.Join(a, ","))
	case faultCrashPoint:
		return fmt.Sprintf("%s %s", f.Crash, f.Target)
	case faultRedisKill, faultRedisStop, faultPgImm, faultPgFast:
		return f.Kind
	}
	return f.Kind + " " + f.Target
}

func (f tortureFault) String() string {
	return fmt.Sprintf("%s @%.1fs+%.1fs", f.label(), f.At.Seconds(), f.For.Seconds())
}

// kind is the fault's kind for counting: the network kind for net faults.
func (f tortureFault) kind() string {
	if f.Kind == faultNet {
		return "net-" + f.Net
	}
	if f.Kind == faultCrashPoint {
		return f.Crash
	}
	return f.Kind
}

// tortureSchedule is everything drawn for one schedule.
type tortureSchedule struct {
	K                              int
	APIs                           int // api,worker processes per service
	ConsumersRelays, WorkersRelays int
	Chats                          int
	Senders                        int // sender goroutines per service
	Clients                        int // WebSocket clients per service
	Redrive                        bool
	Malformed                      int // malformed entries added to each stream
	Faults                         []tortureFault
}

func (s *tortureSchedule) topology() string {
	rd := "re-drive on"
	if !s.Redrive {
		rd = "re-drive off"
	}
	t := fmt.Sprintf("%d api/svc, relays %d+%d, %d chats, %d senders+%d clients/svc, %s", s.APIs, s.ConsumersRelays, s.WorkersRelays, s.Chats, s.Senders, s.Clients, rd)
	if s.Malformed > 0 {
		t += fmt.Sprintf(", %d malformed/stream", s.Malformed)
	}
	return t
}

// procNames returns the schedule's service processes by role: those that
// run a worker (api,worker[,relay]) and those that run a relay.
func (s *tortureSchedule) procNames() (workers, relays []string) {
	for _, svc := range []string{chat.Consumers, chat.Workers} {
		for i := 1; i <= s.APIs; i++ {
			name := svc
			if i > 1 {
				name += "-" + strconv.Itoa(i)
			}
			workers = append(workers, name)
		}
		n := s.ConsumersRelays
		if svc == chat.Workers {
			n = s.WorkersRelays
		}
		if n == 0 {
			for i := 1; i <= s.APIs; i++ {
				name := svc
				if i > 1 {
					name += "-" + strconv.Itoa(i)
				}
				relays = append(relays, name)
			}
		}
		for i := 1; i <= n; i++ {
			name := svc + "-relay"
			if i > 1 {
				name += "-" + strconv.Itoa(i)
			}
			relays = append(relays, name)
		}
	}
	return workers, relays
}

// drawSchedule draws schedule k of seed: the same (seed, k) always gives
// the same schedule.
func drawSchedule(seed uint64, k int, d time.Duration) *tortureSchedule {
	r := rand.New(rand.NewPCG(seed, uint64(k)))
	s := &tortureSchedule{K: k}
	switch r.IntN(3) {
	case 0: // every role in one process per service
		s.APIs = 1
	case 1: // a separate relay
		s.APIs, s.ConsumersRelays, s.WorkersRelays = 1, 1, 1
	default: // two API processes (each with a worker) and two relays per service
		s.APIs, s.ConsumersRelays, s.WorkersRelays = 2, 2, 2
	}
	s.Chats = 3 + r.IntN(6)
	s.Senders = 1 + r.IntN(2)
	s.Clients = 2 + r.IntN(3)
	s.Redrive = r.IntN(2) == 0
	if r.IntN(4) == 0 {
		s.Malformed = 1 + r.IntN(2)
	}
	workers, relays := s.procNames()
	all := slices.Compact(slices.Sorted(slices.Values(append(append([]string(nil), workers...), relays...))))
	links := []string{}
	for _, svc := range []string{chat.Consumers, chat.Workers} {
		links = append(links, svc+">postgres", svc+">redis")
	}
	n := 2 + r.IntN(4)
	ms := func(lo, hi int) time.Duration { return time.Duration(lo+r.IntN(hi-lo+1)) * time.Millisecond }
	for range n {
		f := tortureFault{At: time.Duration(r.Int64N(int64(d * 3 / 4)))}
		switch c := r.IntN(100); {
		case c < 15:
			f.Kind, f.Target, f.For = faultKill, all[r.IntN(len(all))], ms(100, 1500)
		case c < 27:
			f.Kind, f.Target, f.For = faultStop, all[r.IntN(len(all))], ms(300, 4000)
		case c < 37:
			f.Kind, f.Target, f.For = faultTerm, all[r.IntN(len(all))], ms(100, 1500)
		case c < 52:
			f.Kind, f.For = faultCrashPoint, 6*time.Second
			switch r.IntN(3) {
			case 0:
				f.Crash, f.Target = labfault.RelayAfterPublish, relays[r.IntN(len(relays))]
			case 1:
				f.Crash, f.Target = labfault.WorkerBeforeCommit, workers[r.IntN(len(workers))]
			default:
				f.Crash, f.Target = labfault.WorkerAfterCommit, workers[r.IntN(len(workers))]
			}
		case c < 59:
			f.Kind, f.For = faultRedisKill, ms(200, 2500)
		case c < 64:
			f.Kind, f.For = faultRedisStop, ms(200, 2500)
		case c < 69:
			f.Kind, f.For = faultPgImm, ms(200, 2500)
		case c < 74:
			f.Kind, f.For = faultPgFast, ms(200, 2500)
		default:
			f.Kind, f.Target, f.For = faultNet, links[r.IntN(len(links))], ms(500, 5000)
			f.Net = netKinds[r.IntN(len(netKinds))]
			f.Stream = []string{"upstream", "downstream"}[r.IntN(2)]
			switch f.Net {
			case NetLatency:
				f.Attrs = map[string]int{"latency": 20 + r.IntN(480), "jitter": r.IntN(50)}
			case NetTimeout:
				f.Attrs = map[string]int{"timeout": 200 + r.IntN(2000)}
			case NetReset:
				f.Attrs = map[string]int{"timeout": r.IntN(500)}
			case NetBandwidth:
				f.Attrs = map[string]int{"rate": 4 + r.IntN(60)}
			case NetBlackHole:
				f.Attrs = map[string]int{}
			}
		}
		s.Faults = append(s.Faults, f)
	}
	sort.SliceStable(s.Faults, func(i, j int) bool { return s.Faults[i].At < s.Faults[j].At })
	return s
}

// Torture runs the schedules and returns their tally. An error means a run
// could not be set up at all (not an invariant broken: those are in the
// result, Failed > 0).
func Torture(ctx context.Context, opts TortureOptions) (*TortureResult, error) {
	if opts.Schedules <= 0 {
		opts.Schedules = DefaultTortureSchedules
	}
	if opts.Seed == 0 {
		opts.Seed = 1
	}
	if opts.Duration <= 0 {
		opts.Duration = DefaultTortureDuration
	}
	if opts.DrainBound <= 0 {
		opts.DrainBound = DefaultTortureDrainBound
	}
	if opts.Progress == nil {
		opts.Progress = io.Discard
	}
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	// The lab's own Redis client dials a Redis the schedule has stopped on
	// purpose; go-redis would print every failed dial.
	redis.SetLogger(quietRedis{})
	res := &TortureResult{Seed: opts.Seed, Faults: map[string]int{}, Failures: []TortureFailure{}}
	ks := make([]int, 0, opts.Schedules)
	if opts.Only > 0 {
		ks = append(ks, opts.Only)
	} else {
		for k := 1; k <= opts.Schedules; k++ {
			ks = append(ks, k)
		}
	}
	for _, k := range ks {
		s := drawSchedule(opts.Seed, k, opts.Duration)
		s.Faults = dropFaults(s.Faults, opts.Drop)
		for _, f := range s.Faults {
			res.Faults[f.kind()]++
		}
		r, err := runSchedule(ctx, opts, s)
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		if err != nil {
			r = &ScheduleResult{Schedule: k, Topology: s.topology(), Problems: []string{"could not run: " + err.Error()}}
			for _, f := range s.Faults {
				r.Faults = append(r.Faults, f.String())
			}
		}
		res.Schedules++
		res.Runs = append(res.Runs, *r)
		res.Sent += r.Sent
		res.Lost += r.Lost
		res.DuplicatesShown += r.DuplicatesShown
		res.OrderViolations += r.OrderViolations
		res.MaxDrainS = max(res.MaxDrainS, r.DrainS)
		status := "ok"
		if !r.OK {
			status = "FAILED: " + strings.Join(r.Problems, "; ")
		}
		fmt.Fprintf(opts.Progress, "torture schedule %d (%d of %d) seed %d: %s; faults: %s; sent %d, shown %d, reconnects %d, drained in %.1fs: %s\n",
			k, res.Schedules, len(ks), opts.Seed, r.Topology, strings.Join(r.Faults, ", "), r.Sent, r.Shown, r.Reconnects, r.DrainS, status)
		if !r.OK {
			res.Failed++
			f := TortureFailure{Seed: opts.Seed, Schedule: k, Problems: r.Problems}
			fmt.Fprintf(opts.Progress, "torture: replay with: outboxchat lab torture --seed %d --schedule %d --duration %s\n", opts.Seed, k, opts.Duration)
			if opts.Shrink {
				f.Shrunk = shrink(ctx, opts, s)
			}
			res.Failures = append(res.Failures, f)
		}
	}
	return res, nil
}

// quietRedis is a go-redis logger that drops everything.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// dropFaults returns faults without the indexes in drop.
func dropFaults(faults []tortureFault, drop []int) []tortureFault {
	var out []tortureFault
	for i, f := range faults {
		if !slices.Contains(drop, i) {
			out = append(out, f)
		}
	}
	return out
}

// shrink re-runs a failing schedule leaving out one fault at a time,
// keeping each drop under which it still fails, and returns the faults that
// remain and the --drop flag that replays them.
func shrink(ctx context.Context, opts TortureOptions, s *tortureSchedule) string {
	full := s.Faults
	var drop []int
	for i := range full {
		try := append(slices.Clone(drop), i)
		t := *s
		t.Faults = dropFaults(full, try)
		r, err := runSchedule(ctx, opts, &t)
		if ctx.Err() != nil {
			break
		}
		fails := err == nil && !r.OK
		fmt.Fprintf(opts.Progress, "torture: shrink schedule %d without fault %d (%s): %s\n", s.K, i, full[i], map[bool]string{true: "still fails: dropped", false: "passes: kept"}[fails])
		if fails {
			drop = try
		}
	}
	var kept []string
	for _, f := range dropFaults(full, drop) {
		kept = append(kept, f.String())
	}
	ds := make([]string, len(drop))
	for i, d := range drop {
		ds[i] = strconv.Itoa(d)
	}
	if len(kept) == 0 {
		kept = []string{"none (it fails without faults)"}
	}
	out := fmt.Sprintf("faults: %s (replay: --seed %d --schedule %d --duration %s --drop %s)", strings.Join(kept, ", "), opts.Seed, s.K, opts.Duration, strings.Join(ds, ","))
	fmt.Fprintf(opts.Progress, "torture: shrunk schedule %d to %s\n", s.K, out)
	return out
}

// sentMsg is one send that got a 201: what the sender's API answered.
type sentMsg struct {
	From   string
	ID     string
	ChatID int64
	Seq    int64
}

// tortureRun is one schedule's environment and its recorders.
type tortureRun struct {
	s    *tortureSchedule
	env  *Env
	net  *netFaults
	log  *eventLog
	tap  *streamTap
	rng  *rand.Rand
	rmu  sync.Mutex
	mu   sync.Mutex
	sent []sentMsg
	// clients are the WebSocket clients, by service.
	clients map[string][]*Watcher
	// chats is each client's chat.
	chats map[*Watcher]int64
	// locks serialise faults on one target (a process, Postgres, Redis,
	// a link).
	locks map[string]*sync.Mutex
}

func (t *tortureRun) intn(n int) int {
	t.rmu.Lock()
	defer t.rmu.Unlock()
	return t.rng.IntN(n)
}

// proc returns the Env's process named name (nil if none).
func (t *tortureRun) proc(name string) *Proc {
	for _, p := range t.env.Procs() {
		if p.Name() == name {
			return p
		}
	}
	return nil
}

// apiURLs returns the base URLs of service's API processes.
func (t *tortureRun) apiURLs(service string) []string {
	ps := []*Proc{t.env.Consumers}
	ps = append(ps, t.env.ConsumersAPIs...)
	if service == chat.Workers {
		ps = append([]*Proc{t.env.Workers}, t.env.WorkersAPIs...)
	}
	var out []string
	for _, p := range ps {
		out = append(out, p.URL())
	}
	return out
}

func (t *tortureRun) lock(target string) *sync.Mutex {
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
func runSchedule(ctx context.Context, opts TortureOptions, s *tortureSchedule) (*ScheduleResult, error) {
	res := &ScheduleResult{Schedule: s.K, Topology: s.topology()}
	for _, f := range s.Faults {
		res.Faults = append(res.Faults, f.String())
	}
	nf := newNetFaults()
	defer nf.close()
	args := append([]string{"--lock-duration", tortureLockDuration.String()}, unlimitedArgs...)
	if !s.Redrive {
		args = append(args, "--redrive-after", "0")
	}
	dir := ""
	if opts.Dir != "" {
		dir = fmt.Sprintf("%s/s%d", opts.Dir, s.K)
	}
	env, err := StartEnv(ctx, EnvOptions{APIs: s.APIs, ConsumersRelays: s.ConsumersRelays, WorkersRelays: s.WorkersRelays,
		LockDuration: tortureLockDuration, ExtraArgs: args, Route: nf.route, Dir: dir})
	if err != nil {
		return nil, err
	}
	defer env.Close()
	t := &tortureRun{s: s, env: env, net: nf, log: &eventLog{w: opts.Log}, rng: rand.New(rand.NewPCG(uint64(s.K), 7)),
		clients: map[string][]*Watcher{}, chats: map[*Watcher]int64{}, locks: map[string]*sync.Mutex{}}
	t.log.start()
	if t.tap, err = startStreamTap(ctx, env); err != nil {
		return nil, err
	}
	defer t.tap.stop()

	// WebSocket clients on both sides, each on one chat, dropped and
	// reconnected (to any API process of its service) at random.
	for _, svc := range []string{chat.Consumers, chat.Workers} {
		urls := t.apiURLs(svc)
		for i := range s.Clients {
			chatID := int64(1 + (i+len(t.chats))%s.Chats)
			w, err := NewWatcher(urls[0], chatID, &WatcherConfig{Token: env.Token, Base: func() string { return urls[t.intn(len(urls))] }})
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
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := w.WaitConnected(wctx)
			cancel()
			if err != nil {
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
		for sleepUntil(lctx, time.Now().Add(250*time.Millisecond)) == nil {
			t.tap.sampleAcks(lctx, env)
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
	err = sleepUntil(ctx, start.Add(opts.Duration))
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
	derr := waitFor(dctx, 200*time.Millisecond, func() bool {
		t.tap.sampleAcks(dctx, env)
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
func (t *tortureRun) sendLoop(ctx context.Context, service string, i uint64) {
	r := rand.New(rand.NewPCG(uint64(t.s.K)*1000+i, uint64(len(service))))
	urls := t.apiURLs(service)
	snd := newSender(t.env.Token)
	n := 0
	for ctx.Err() == nil {
		n++
		chatID := int64(1 + r.IntN(t.s.Chats))
		m, err := snd.send(ctx, urls[r.IntN(len(urls))], chatID, fmt.Sprintf("%s %d.%d", service, i, n))
		if err == nil {
			t.mu.Lock()
			t.sent = append(t.sent, sentMsg{From: service, ID: m.ID, ChatID: m.ChatID, Seq: m.Seq})
			t.mu.Unlock()
		}
		if sleepUntil(ctx, time.Now().Add(tortureSendEvery)) != nil {
			return
		}
	}
}

// dropLoop closes w's connection at random moments (0.3–3 s apart).
func (t *tortureRun) dropLoop(ctx context.Context, w *Watcher) {
	for {
		if sleepUntil(ctx, time.Now().Add(time.Duration(300+t.intn(2700))*time.Millisecond)) != nil {
			return
		}
		w.Drop()
	}
}

// injectMalformed adds s.Malformed entries that no sender wrote (no
// signature, a payload that is not an event) to each stream, after wait.
func (t *tortureRun) injectMalformed(ctx context.Context, wait time.Duration) {
	if sleepUntil(ctx, time.Now().Add(wait)) != nil {
		return
	}
	for _, from := range []string{chat.Consumers, chat.Workers} {
		for i := range t.s.Malformed {
			err := t.env.rdb.XAdd(ctx, malformedEntry(from, fmt.Sprintf("00000000-0000-4000-8000-%012d", i+1))).Err()
			if err != nil {
				t.log.add("lab", "could not inject a malformed entry: %v", err)
				continue
			}
			t.tap.injected(from)
		}
	}
}

// apply runs fault f: it waits until start+f.At, applies it, waits f.For
// (or until ctx ends: the fault phase is over) and reverts it.
func (t *tortureRun) apply(ctx context.Context, start time.Time, f tortureFault) {
	if sleepUntil(ctx, start.Add(f.At)) != nil {
		return
	}
	target := f.Target
	switch f.Kind {
	case faultRedisKill, faultRedisStop:
		target = "redis"
	case faultPgImm, faultPgFast:
		target = "postgres"
	}
	m := t.lock(target)
	m.Lock()
	defer m.Unlock()
	if ctx.Err() != nil {
		return
	}
	// Reverting uses a context of its own: it must run after ctx ends.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	hold := func() { _ = sleepUntil(ctx, time.Now().Add(f.For)) }
	p := t.proc(f.Target)
	switch f.Kind {
	case faultKill:
		t.log.add("fault", "SIGKILL %s", f.Target)
		_ = p.Kill()
		hold()
		t.restart(rctx, p)
	case faultTerm:
		t.log.add("fault", "SIGTERM %s", f.Target)
		_ = p.Stop(rctx)
		hold()
		t.restart(rctx, p)
	case faultStop:
		t.log.add("fault", "SIGSTOP %s", f.Target)
		_ = p.Signal(syscall.SIGSTOP)
		hold()
		_ = p.Signal(syscall.SIGCONT)
		t.log.add("fault", "SIGCONT %s", f.Target)
	case faultCrashPoint:
		t.crashPoint(ctx, rctx, p, f)
	case faultRedisKill, faultRedisStop, faultPgImm, faultPgFast:
		stop := map[string]func() error{
			faultRedisKill: t.env.Redis.Kill,
			faultRedisStop: func() error { return t.env.Redis.Stop(rctx) },
			faultPgImm:     func() error { return t.env.Postgres.StopImmediate(rctx) },
			faultPgFast:    func() error { return t.env.Postgres.Stop(rctx) },
		}[f.Kind]
		restart := t.env.Redis.Restart
		if target == "postgres" {
			restart = t.env.Postgres.Restart
		}
		_ = stop()
		t.log.add("fault", "%s", f.Kind)
		hold()
		if err := restart(rctx); err != nil {
			t.log.add("lab", "%s restart: %v", target, err)
		}
		t.log.add("fault", "%s up", target)
	case faultNet:
		name, err := t.net.add(f.Target, f.Net, f.Stream, f.Attrs)
		if err != nil {
			t.log.add("lab", "%v", err)
			return
		}
		t.log.add("fault", "net %s", f.label())
		hold()
		t.net.remove(f.Target, name)
		t.log.add("fault", "net %s removed", f.label())
	}
}

// restart starts p again if it is not running.
func (t *tortureRun) restart(ctx context.Context, p *Proc) {
	if p.Running() {
		return
	}
	if err := p.StartReady(ctx); err != nil {
		t.log.add("lab", "restart %s: %v", p.Name(), err)
		return
	}
	t.log.add("fault", "%s started again", p.Name())
}

// crashPoint restarts p with --fault KIND:SEQ, SEQ a little above the
// highest seq the step will see next, waits until p crashes there (or the
// fault's time is up) and starts it again without the fault.
func (t *tortureRun) crashPoint(ctx, rctx context.Context, p *Proc, f tortureFault) {
	side := p.Name()[:strings.IndexAny(p.Name()+"-", "-")]
	if f.Crash != labfault.RelayAfterPublish {
		side = chat.Peer(side) // a worker sees the other side's seqs
	}
	var top int64
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_ = t.env.admin.QueryRow(qctx, `SELECT coalesce(max(seq), 0) FROM `+side+`.messages`).Scan(&top)
	cancel()
	spec := fmt.Sprintf("%s:%d", f.Crash, top+3)
	args := withoutFlag(p.Args(), "--fault")
	_ = p.Stop(rctx)
	p.SetArgs(append(slices.Clone(args), "--fault", spec))
	t.log.add("fault", "%s restarted with --fault %s", p.Name(), spec)
	if err := p.StartReady(rctx); err == nil {
		exited, _ := p.Exited()
		select {
		case <-exited:
			t.log.add("fault", "%s crashed at %s", p.Name(), spec)
		case <-ctx.Done():
		case <-time.After(f.For):
		}
	}
	_ = p.Stop(rctx)
	p.SetArgs(args)
	t.restart(rctx, p)
}

// heal ends every fault: toxics removed, servers and processes running and
// continued.
func (t *tortureRun) heal(ctx context.Context) error {
	t.net.clear()
	if !t.env.Postgres.Running() {
		if err := t.env.Postgres.Restart(ctx); err != nil {
			return fmt.Errorf("lab: torture: heal postgres: %w", err)
		}
	}
	if !t.env.Redis.Running() {
		if err := t.env.Redis.Restart(ctx); err != nil {
			return fmt.Errorf("lab: torture: heal redis: %w", err)
		}
	}
	for _, p := range t.env.Procs() {
		if p.Running() {
			_ = p.Signal(syscall.SIGCONT)
			continue
		}
		if err := p.StartReady(ctx); err != nil {
			return fmt.Errorf("lab: torture: heal: %w", err)
		}
	}
	return nil
}

// sentCopy returns the 201 sends so far.
func (t *tortureRun) sentCopy() []sentMsg {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.sent)
}

// drained reports whether the drain is done (see drainState).
func (t *tortureRun) drained(ctx context.Context) bool { return t.drainState(ctx) == "" }

// drainState returns "" when every 201 send is in the receiver's inbox,
// every client has seen 1..N of both sides of its chat (N read from the
// senders' messages tables), both outboxes are empty and both streams'
// groups have nothing pending or undelivered; else what is missing.
func (t *tortureRun) drainState(ctx context.Context) string {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var missing []string
	for _, svc := range []string{chat.Consumers, chat.Workers} {
		var unsent int
		if err := t.env.admin.QueryRow(qctx, `SELECT count(*) FROM `+svc+`.outbox WHERE sent_at IS NULL`).Scan(&unsent); err != nil {
			return "database: " + err.Error()
		}
		if unsent > 0 {
			missing = append(missing, fmt.Sprintf("%s outbox: %d unsent", svc, unsent))
		}
		if s := streamDrained(qctx, t.env, svc); s != "" {
			missing = append(missing, s)
		}
	}
	inInbox, err := t.inboxed(qctx)
	if err != nil {
		return "database: " + err.Error()
	}
	notIn := 0
	for _, m := range t.sentCopy() {
		if _, ok := inInbox[m.ID]; !ok {
			notIn++
		}
	}
	if notIn > 0 {
		missing = append(missing, fmt.Sprintf("%d sends not in the receiver's inbox", notIn))
	}
	tops, err := t.tops(qctx)
	if err != nil {
		return "database: " + err.Error()
	}
	unseen := 0
	for _, ws := range t.clients {
		for _, w := range ws {
			for _, side := range []string{chat.Consumers, chat.Workers} {
				seen := w.Seen(side)
				for seq := int64(1); seq <= tops[side][t.chats[w]]; seq++ {
					if _, ok := seen[seq]; !ok {
						unseen++
					}
				}
			}
		}
	}
	if unseen > 0 {
		missing = append(missing, fmt.Sprintf("%d (client, side, seq) not shown yet", unseen))
	}
	return strings.Join(missing, ", ")
}

// inboxed returns every inbox row of both services: message id → row.
func (t *tortureRun) inboxed(ctx context.Context) (map[string]sentMsg, error) {
	out := map[string]sentMsg{}
	for _, svc := range []string{chat.Consumers, chat.Workers} {
		rows, err := t.env.admin.Query(ctx, `SELECT message_id::text, chat_id, seq FROM `+svc+`.inbox`)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			m := sentMsg{From: chat.Peer(svc)}
			if err := rows.Scan(&m.ID, &m.ChatID, &m.Seq); err != nil {
				rows.Close()
				return nil, err
			}
			out[m.ID] = m
		}
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// tops returns, per side and chat, the highest seq the side stored.
func (t *tortureRun) tops(ctx context.Context) (map[string]map[int64]int64, error) {
	out := map[string]map[int64]int64{}
	for _, svc := range []string{chat.Consumers, chat.Workers} {
		out[svc] = map[int64]int64{}
		rows, err := t.env.admin.Query(ctx, `SELECT chat_id, max(seq) FROM `+svc+`.messages GROUP BY chat_id`)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var c, s int64
			if err := rows.Scan(&c, &s); err != nil {
				rows.Close()
				return nil, err
			}
			out[svc][c] = s
		}
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// check runs the checker on the drained (or not) system and fills res.
func (t *tortureRun) check(ctx context.Context, res *ScheduleResult) {
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	sent := t.sentCopy()
	res.Sent = len(sent)
	problem := func(format string, args ...any) { res.Problems = append(res.Problems, fmt.Sprintf(format, args...)) }

	// 1. Every 201 send is in the receiver's inbox once, with the
	// sender's (chat, seq), and in the sender's own messages table.
	inInbox, err := t.inboxed(qctx)
	if err != nil {
		problem("read inboxes: %v", err)
		return
	}
	stored := map[string]sentMsg{}
	for _, svc := range []string{chat.Consumers, chat.Workers} {
		rows, err := t.env.admin.Query(qctx, `SELECT id::text, chat_id, seq FROM `+svc+`.messages`)
		if err != nil {
			problem("read %s.messages: %v", svc, err)
			return
		}
		for rows.Next() {
			m := sentMsg{From: svc}
			if rows.Scan(&m.ID, &m.ChatID, &m.Seq) == nil {
				stored[m.ID] = m
			}
		}
		rows.Close()
	}
	var lost, wrong []string
	for _, m := range sent {
		got, ok := inInbox[m.ID]
		switch {
		case !ok:
			lost = append(lost, fmt.Sprintf("%s chat %d seq %d", m.From, m.ChatID, m.Seq))
		case got.ChatID != m.ChatID || got.Seq != m.Seq || got.From != m.From:
			wrong = append(wrong, fmt.Sprintf("%s chat %d seq %d is in the inbox as chat %d seq %d", m.From, m.ChatID, m.Seq, got.ChatID, got.Seq))
		}
		if st, ok := stored[m.ID]; !ok || st.ChatID != m.ChatID || st.Seq != m.Seq {
			wrong = append(wrong, fmt.Sprintf("%s answered 201 for chat %d seq %d but did not store it so", m.From, m.ChatID, m.Seq))
		}
	}
	// An inbox row with no message behind it (a phantom) is as wrong.
	for id, m := range inInbox {
		if st, ok := stored[id]; !ok || st.ChatID != m.ChatID || st.Seq != m.Seq || st.From != m.From {
			wrong = append(wrong, fmt.Sprintf("inbox row %s (chat %d seq %d) matches no message of %s", id, m.ChatID, m.Seq, m.From))
		}
	}
	res.Lost += len(lost)
	if len(lost) > 0 {
		problem("%d send(s) answered 201 are not in the receiver's inbox: %s", len(lost), firstFew(lost))
	}
	if len(wrong) > 0 {
		problem("%d wrong row(s): %s", len(wrong), firstFew(wrong))
	}

	// 2. Each client: no frame twice on one connection; per side, seqs
	// rising on each connection; over all connections exactly 1..N.
	tops, err := t.tops(qctx)
	if err != nil {
		problem("read messages: %v", err)
		return
	}
	shown := map[string]bool{}
	ci := 0
	for _, svc := range []string{chat.Consumers, chat.Workers} {
		for _, w := range t.clients[svc] {
			ci++
			v := checkView(w.Frames(), t.chats[w], tops)
			res.Reconnects += max(0, w.Connects()-1)
			res.DuplicatesShown += len(v.dups)
			res.OrderViolations += len(v.order)
			res.Lost += len(v.missing)
			for _, f := range w.Frames() {
				shown[f.Message.ID] = true
			}
			name := fmt.Sprintf("client %d (%s, chat %d)", ci, svc, t.chats[w])
			if len(v.dups) > 0 {
				problem("%s was shown %d message(s) twice on one connection: %s", name, len(v.dups), firstFew(v.dups))
			}
			if len(v.order) > 0 {
				problem("%s saw seqs out of order on one connection: %s", name, firstFew(v.order))
			}
			if len(v.missing) > 0 {
				problem("%s never saw %s", name, firstFew(v.missing))
			}
			if len(v.extra) > 0 {
				problem("%s saw messages that were never stored: %s", name, firstFew(v.extra))
			}
		}
	}
	res.Shown = len(shown)

	// 3. Each stream: entries of a chat added in seq order.
	order := t.tap.violations()
	res.OrderViolations += len(order)
	if len(order) > 0 {
		problem("stream entries out of order: %s", firstFew(order))
	}

	// 4. No entry acknowledged before its message was in the inbox.
	t.tap.sampleAcks(qctx, t.env)
	if early := t.tap.earlyAcks(); len(early) > 0 {
		problem("%d entr(ies) acknowledged before the inbox commit: %s", len(early), firstFew(early))
	}

	// 5. Dead letters only for the entries the schedule injected.
	for _, svc := range []string{chat.Consumers, chat.Workers} {
		n, err := t.env.rdb.XLen(qctx, tortureKeys(svc).Dead).Result()
		if err != nil {
			problem("read dead letters: %v", err)
			continue
		}
		res.DeadLetters += int(n)
		if want := int64(t.tap.injectedCount(svc)); n != want {
			problem("%d dead letter(s) on %s, want %d (the malformed entries injected)", n, chat.QueueName(svc), want)
		}
	}
}

// view is what checkView found wrong with one client's frames.
type view struct {
	dups, order, missing, extra []string
}

// checkView checks the frames one client received for chat chatID
// against tops (side → chat → highest stored seq): a frame twice on one
// connection (dups), a seq not above the last of its side on its
// connection (order), a seq 1..N of a side never shown (missing), a seq
// above N (extra).
func checkView(frames []Shown, chatID int64, tops map[string]map[int64]int64) view {
	var v view
	type key struct {
		conn int
		side string
	}
	last := map[key]int64{}
	onConn := map[key]map[int64]bool{}
	seen := map[string]map[int64]bool{}
	for _, f := range frames {
		m := f.Message
		k := key{f.Conn, m.From}
		if onConn[k] == nil {
			onConn[k] = map[int64]bool{}
		}
		if seen[m.From] == nil {
			seen[m.From] = map[int64]bool{}
		}
		switch {
		case onConn[k][m.Seq]:
			v.dups = append(v.dups, fmt.Sprintf("%s seq %d (connection %d)", m.From, m.Seq, f.Conn))
		case m.Seq <= last[k]:
			v.order = append(v.order, fmt.Sprintf("%s seq %d after seq %d (connection %d)", m.From, m.Seq, last[k], f.Conn))
		}
		if m.ChatID != chatID {
			v.extra = append(v.extra, fmt.Sprintf("a frame of chat %d", m.ChatID))
		}
		onConn[k][m.Seq] = true
		seen[m.From][m.Seq] = true
		last[k] = max(last[k], m.Seq)
	}
	for _, side := range []string{chat.Consumers, chat.Workers} {
		top := tops[side][chatID]
		for seq := int64(1); seq <= top; seq++ {
			if !seen[side][seq] {
				v.missing = append(v.missing, fmt.Sprintf("%s seq %d", side, seq))
			}
		}
		for seq := range seen[side] {
			if seq > top {
				v.extra = append(v.extra, fmt.Sprintf("%s seq %d (stored up to %d)", side, seq, top))
			}
		}
	}
	return v
}

// firstFew joins up to 5 items, noting how many more there are.
func firstFew(items []string) string {
	if len(items) <= 5 {
		return strings.Join(items, "; ")
	}
	return strings.Join(items[:5], "; ") + fmt.Sprintf("; … %d more", len(items)-5)
}

// runTortureCmd runs `lab torture`.
func runTortureCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("lab torture", flag.ContinueOnError)
	fs.SetOutput(stderr)
	schedules := fs.Int("schedules", DefaultTortureSchedules, "how many random fault schedules to run")
	seed := fs.Uint64("seed", 1, "seed of the schedules' draw (a failure prints it)")
	only := fs.Int("schedule", 0, "run only schedule K of --seed (a replay)")
	dur := fs.Duration("duration", DefaultTortureDuration, "load-and-fault phase of each schedule")
	drain := fs.Duration("drain-bound", DefaultTortureDrainBound, "the drain must finish within this long")
	drop := fs.String("drop", "", "comma-separated fault indexes to leave out (the shrinker prints them)")
	shrinkF := fs.Bool("shrink", false, "re-run a failing schedule without one fault at a time, keeping the drops under which it still fails")
	dir := fs.String("dir", "", "keep the process logs here (DIR/s<K>/<process>.log)")
	asJSON := fs.Bool("json", false, "print one JSON object (schedules, failed, lost, duplicates_shown, order_violations, max_drain_s, failures, …)")
	verbose := fs.Bool("v", false, "print the fault events to stderr")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("lab torture: unexpected arguments %q", fs.Args())
	}
	opts := TortureOptions{Schedules: *schedules, Seed: *seed, Only: *only, Duration: *dur, DrainBound: *drain,
		Shrink: *shrinkF, Progress: stderr, Dir: *dir}
	if *verbose {
		opts.Log = stderr
	}
	if *drop != "" {
		for _, s := range strings.Split(*drop, ",") {
			i, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || i < 0 {
				return fmt.Errorf("lab torture: --drop %q: want fault indexes", *drop)
			}
			opts.Drop = append(opts.Drop, i)
		}
	}
	res, err := Torture(ctx, opts)
	if res != nil {
		if *asJSON {
			_ = json.NewEncoder(stdout).Encode(res)
		} else {
			fmt.Fprintf(stdout, "schedules: %d   failed: %d   sent: %d   lost: %d   shown twice: %d   order violations: %d   max drain: %.1fs\n",
				res.Schedules, res.Failed, res.Sent, res.Lost, res.DuplicatesShown, res.OrderViolations, res.MaxDrainS)
			for _, f := range res.Failures {
				fmt.Fprintf(stdout, "failed: --seed %d --schedule %d: %s\n", f.Seed, f.Schedule, strings.Join(f.Problems, "; "))
			}
		}
	}
	if err != nil {
		return err
	}
	if res.Failed > 0 {
		return fmt.Errorf("%w: lab torture: %d of %d schedules failed", ErrInvariant, res.Failed, res.Schedules)
	}
	return nil
}

func init() { extraCommands["torture"] = runTortureCmd }
