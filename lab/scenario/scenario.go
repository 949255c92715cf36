package scenario

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/lease"
	"github.com/outboxchat/outboxchat/lab/chaos"
	"github.com/outboxchat/outboxchat/lab/env"
	"github.com/outboxchat/outboxchat/lab/fault"
	"github.com/outboxchat/outboxchat/lab/probe"
	"github.com/outboxchat/outboxchat/lab/process"
	"github.com/outboxchat/outboxchat/redisq"
)

// scenario is a named fault scenario.
type scenario struct {
	name, doc string
	run       func(ctx context.Context, s *run) error
	opts      env.Options
	// anyBroker: the scenario's faults are the services' and Postgres's,
	// not the queue's, so it runs on either broker (Options.Broker).
	anyBroker bool
}

// scenarios are listed (Names) in this order.
var scenarios = []scenario{
	{name: "relay-crash", doc: "the relay gets SIGKILL between its publish and its commit; restarted, it re-sends; nothing shown twice",
		opts:      env.Options{ConsumersRelays: 1, Faults: map[string]string{"consumers-relay": fault.Spec(fault.RelayAfterPublish, 3)}},
		anyBroker: true, run: relayCrash},
	{name: "relay-freeze", doc: "two relays; one is frozen (SIGSTOP) while it holds a batch; the other delivers, bounded by the relay's timeouts",
		opts: env.Options{ConsumersRelays: 2}, anyBroker: true, run: relayFreeze},
	{name: "postgres-restart", doc: "Postgres restarts while messages are sent: 503s, nothing half-written; the relay re-LISTENs and catches up",
		anyBroker: true, run: postgresRestart},
	{name: "redis-restart", doc: "Redis is killed (SIGKILL) and restarted with jobs queued for a stopped worker: AOF keeps them",
		run: redisRestart},
	{name: "worker-crash-before-commit", doc: "the worker gets SIGKILL after reading a job, before its inbox commit; another worker reclaims it after the lock duration; order holds",
		opts: env.Options{Faults: map[string]string{env.ProcWorkers: fault.Spec(fault.WorkerBeforeCommit, 3)}}, anyBroker: true, run: workerCrashBeforeCommit},
	{name: "redis-flush", doc: "workers stopped; 20 messages published and marked sent; FLUSHALL; workers started: the re-drive brings all 20, each shown once, in order",
		run: redisFlush},
	{name: "stream-entry-deleted", doc: "workers stopped; 2 messages published; a ghost consumer reads the first and its entry is XDELed; workers started: counted, re-driven, shown once, in order",
		run: streamEntryDeleted},
	{name: "redis-failover", doc: "Sentinel-managed primary + replica; the replica held back while 5 messages are published; primary killed, replica promoted without them: the re-drive brings them, each shown once, in order",
		opts: env.Options{Sentinel: true}, run: redisFailover},
	{name: "cluster-failover", doc: "Redis Cluster (3 masters + 3 replicas); the queue's master killed with its replica held back (5 jobs it never got), replica promoted, messages sent across it: the re-drive brings the 5, each shown once, in order",
		opts: env.Options{RedisCluster: true}, run: clusterFailover},
	{name: "cluster-reshard", doc: "Redis Cluster (3 masters + 3 replicas); both queues' slots moved to another master key by key while a sender sends every 50 ms: each shown once, in order; reports the longest delivery gap during the move",
		opts: env.Options{RedisCluster: true}, run: clusterReshard},
	{name: "nats-leader-kill", doc: "the queue on a 3-node JetStream cluster (streams of 3 replicas); the stream's leader killed (SIGKILL) while a sender sends every 50 ms: a new leader elected, each message shown once, in order",
		opts: env.Options{Broker: env.BrokerNATS, NATSCluster: true}, run: natsLeaderKill},
	{name: "nats-cluster-restart", doc: "the queue on a 3-node JetStream cluster; every node killed with 5 messages queued for stopped workers, 5 more sent while it is down, all nodes started again: each shown once, in order",
		opts: env.Options{Broker: env.BrokerNATS, NATSCluster: true}, run: natsClusterRestart},
}

// AnyBroker returns the names of the scenarios that run on either broker
// (Options.Broker), in the order of Names.
func AnyBroker() []string {
	var out []string
	for _, s := range scenarios {
		if s.anyBroker {
			out = append(out, s.name)
		}
	}
	return out
}

// Names returns the names of the scenarios, in their listing order.
func Names() []string {
	var out []string
	for _, s := range scenarios {
		out = append(out, s.name)
	}
	return out
}

// Doc returns what scenario name does, in one line ("" for no scenario).
func Doc(name string) string {
	if sc := find(name); sc != nil {
		return sc.doc
	}
	return ""
}

func find(name string) *scenario {
	for i := range scenarios {
		if scenarios[i].name == name {
			return &scenarios[i]
		}
	}
	return nil
}

// run is one scenario's environment, watcher and event log.
type run struct {
	e        *env.Env
	w        *probe.Watcher
	log      *probe.EventLog
	snd      *probe.Sender
	sent     int
	lastSend time.Time
	extra    []string // extra invariant violations found by the scenario
	measures Measures
}

// Measures are a scenario's own measurements, in its Result (zero and
// left out of the JSON when the scenario does not measure them).
type Measures struct {
	// MaxGapBeforeMs and MaxGapDuringMs are the longest times (ms)
	// between two consecutive messages shown on the workers' client in
	// the 2 s before a slot move and during it (to 1 s after its end),
	// with a sender sending throughout (cluster-reshard); MoveMs is how
	// long the move took.
	MaxGapBeforeMs int64 `json:"max_gap_before_ms,omitempty"`
	MaxGapDuringMs int64 `json:"max_gap_during_ms,omitempty"`
	MoveMs         int64 `json:"move_ms,omitempty"`
}

// partition returns chaos.Chat's partition (chat.Partition).
func (s *run) partition() int { return chat.Partition(chaos.Chat, s.e.Partitions) }

// queue returns the name of the queue from service from that chaos.Chat's
// events travel in: its partition's (chat.PartitionQueue).
func (s *run) queue(from string) string { return chat.PartitionQueue(from, s.partition()) }

// queueKeys returns the Redis keys of s.queue(from).
func (s *run) queueKeys(from string) redisq.Keys {
	return redisq.NewKeys(env.RedisPrefix, s.queue(from))
}

// send sends "msg N" (N counting up) to chaos.Chat on consumers and logs it.
func (s *run) send(ctx context.Context) {
	s.sent++
	body := fmt.Sprintf("msg %d", s.sent)
	s.lastSend = time.Now()
	if _, err := s.snd.Send(ctx, s.e.ConsumersURL, chaos.Chat, body); err != nil {
		s.log.Add("consumers", "%s not saved: %v", body, err)
		return
	}
	s.log.Add("consumers", "%s saved", body)
}

// sendEvery sends n messages, one every interval.
func (s *run) sendEvery(ctx context.Context, n int, interval time.Duration) error {
	for range n {
		if err := env.SleepUntil(ctx, s.lastSend.Add(interval)); err != nil {
			return err
		}
		s.send(ctx)
	}
	return nil
}

// restartAfterExit starts p again with args once its current run exits
// (p.RestartOnExit), logging what happened; the channel closes when done.
func (s *run) restartAfterExit(ctx context.Context, p *process.Proc, args []string, what string) <-chan struct{} {
	return p.RestartOnExit(ctx, args, func() { s.log.Add(p.Name(), "%s", what) }, func(err error) {
		if err != nil {
			s.log.Add("lab", "could not restart %s: %v", p.Name(), err)
			return
		}
		s.log.Add("deploy", "%s started again", p.Name())
	})
}

// inject applies f (env.Env.Inject) and, when that worked, logs event as
// actor's.
func (s *run) inject(ctx context.Context, f fault.Fault, actor, event string) (env.Heal, error) {
	heal, err := s.e.Inject(ctx, f)
	if err == nil {
		s.log.Add(actor, "%s", event)
	}
	return heal, err
}

// heal runs heal and, when that worked, logs event as actor's.
func (s *run) heal(ctx context.Context, heal env.Heal, actor, event string) error {
	if err := heal(ctx); err != nil {
		return err
	}
	s.log.Add(actor, "%s", event)
	return nil
}

// Options adjusts a scenario's run. The zero value is the scenario as
// listed.
type Options struct {
	// ExtraArgs are appended to every serve command line (e.g.
	// "--redrive-after", "0" to show what the re-drive heals).
	ExtraArgs []string
	// Broker runs the scenario with the queue on env.BrokerRedis or
	// env.BrokerNATS; "" (the default) is the scenario's own: JetStream for
	// the nats-* scenarios, Redis Streams for the others. Only the
	// scenarios whose faults are not the queue's (relay-crash,
	// relay-freeze, postgres-restart, worker-crash-before-commit) take
	// either; for the others another broker is an error.
	Broker string
	// Partitions is the services' --partitions (env.Options.Partitions):
	// the scenario's chat (chaos.Chat) then travels in its partition's
	// queue (chat.Partition), which is the queue the scenario's faults
	// aim at. Default 0 means 1.
	Partitions int
	// Log receives the event log; Progress the progress lines. nil
	// discards them.
	Log, Progress io.Writer
}

// Run runs the named scenario and returns its figures, or an error
// wrapping probe.ErrInvariant when it ran but an invariant broke (the
// figures are returned too), or another error when it could not run.
func Run(ctx context.Context, name string, so Options) (*probe.Figures, error) {
	f, _, err := RunMeasured(ctx, name, so)
	return f, err
}

// RunMeasured is Run that also returns the scenario's own measurements.
func RunMeasured(ctx context.Context, name string, so Options) (*probe.Figures, Measures, error) {
	s, f, err := runScenario(ctx, name, so)
	if s == nil {
		return f, Measures{}, err
	}
	return f, s.measures, err
}

// runScenario is RunMeasured; the run is nil when the scenario could not
// start.
func runScenario(ctx context.Context, name string, so Options) (_ *run, _ *probe.Figures, err error) {
	sc := find(name)
	if sc == nil {
		return nil, nil, fmt.Errorf("lab: unknown scenario %q (see lab chaos --list)", name)
	}
	progress := so.Progress
	if progress == nil {
		progress = io.Discard
	}
	opts := sc.opts
	switch own := cmp.Or(opts.Broker, env.BrokerRedis); {
	case so.Broker == "" || so.Broker == own:
	case so.Broker != env.BrokerRedis && so.Broker != env.BrokerNATS:
		return nil, nil, fmt.Errorf("lab: unknown broker %q (want redis or nats)", so.Broker)
	case sc.anyBroker:
		opts.Broker = so.Broker
	default:
		return nil, nil, fmt.Errorf("lab: scenario %s runs on %s only (its faults are that queue's); on either broker: %s", name, own, strings.Join(AnyBroker(), ", "))
	}
	opts.Progress = progress
	opts.ExtraArgs = append(append([]string(nil), opts.ExtraArgs...), so.ExtraArgs...)
	opts.Partitions = so.Partitions
	e, err := env.Start(ctx, opts)
	if err != nil {
		return nil, nil, err
	}
	defer e.Close()
	s := &run{e: e, log: probe.NewEventLog(so.Log), snd: probe.NewSender(e.Token)}
	fail := func(err error) (*run, *probe.Figures, error) { return s, nil, err }
	events := probe.NewEvents()
	defer events.Close()
	s.w, err = probe.NewWatcher(e.WorkersURL, chaos.Chat, &probe.WatcherConfig{Token: e.Token, OnFrame: probe.LogFrames(s.log, true)})
	if err != nil {
		return fail(err)
	}
	if err := s.w.Start(ctx); err != nil {
		return fail(err)
	}
	defer s.w.Stop(context.Background())
	defer e.Workers.Subscribe(func(l process.LogLine) {
		if probe.LogDuplicate(ctx, e, s.log, events, l) {
			return
		}
		switch l.Event() {
		case string(redisq.EventReclaimed):
			s.log.At(l.Time, "workers", "reclaimed %s stalled job(s) after the lock duration", l.Str("count"))
		case fault.EventCrash:
			s.log.At(l.Time, "workers", "fault injected: crashing (%s)", l.Str("fault"))
		case string(redisq.EventDeletedPending):
			s.log.At(l.Time, "workers", "pending entry %s found deleted from the stream: counted, acknowledged away", l.Str("stream_id"))
		case string(redisq.EventGroupLost):
			s.log.At(l.Time, "workers", "consumer group gone (NOGROUP): created again from 0")
		}
	})()
	defer e.Consumers.Subscribe(func(l process.LogLine) {
		if l.Event() == chat.EventRedriven {
			s.log.At(l.Time, "consumers", "seq %s (message %s) had no receipt: re-driven", l.Str("seq"), l.Str("message_id"))
		}
	})()
	for _, p := range e.ConsumersRelays {
		defer p.Subscribe(func(l process.LogLine) {
			if l.Event() == fault.EventCrash {
				s.log.At(l.Time, p.Name(), "fault injected: crashing (%s)", l.Str("fault"))
			}
		})()
	}
	if err := probe.Connect(ctx, s.w); err != nil {
		return fail(fmt.Errorf("lab: watcher could not connect: %w", err))
	}
	if e.Partitions > 1 {
		fmt.Fprintf(progress, "lab: scenario %s, %d partitions (chat %d in partition %d: queue %s)\n", name, e.Partitions,
			chaos.Chat, s.partition(), s.queue(chat.Consumers))
	} else {
		fmt.Fprintf(progress, "lab: scenario %s\n", name)
	}
	s.log.Start()
	s.lastSend = time.Now().Add(-time.Hour)
	if err := sc.run(ctx, s); err != nil {
		return fail(err)
	}
	settle := 2*e.LockDuration + 10*time.Second
	fmt.Fprintf(progress, "lab: waiting up to %v for everything saved to be shown\n", settle)
	if err := probe.WaitSettled(ctx, e, s.w, s.lastSend.Add(settle), 100*time.Millisecond); err != nil {
		return fail(err)
	}
	f, err := probe.ReadFigures(ctx, e, s.w)
	if err != nil {
		return fail(err)
	}
	err = f.CheckInvariants()
	if len(s.extra) > 0 {
		err = errors.Join(err, fmt.Errorf("%v", s.extra))
	}
	if err != nil {
		return s, f, fmt.Errorf("%w: scenario %s: %w", probe.ErrInvariant, name, err)
	}
	return s, f, nil
}

// Result is the `lab scenario NAME --json` object (DESIGN.md): the
// scenario's name, messages sent (saved by consumers), received (shown at
// the workers' WebSocket client), lost (seqs saved and never shown; []
// when none), duplicates shown, order violations ([] when none), messages
// re-driven (sum of consumers.messages.redrives) and ok (every invariant
// held); plus the chaos figures and the scenario's Measures.
type Result struct {
	Scenario          string   `json:"scenario"`
	Sent              int      `json:"sent"`
	Received          int      `json:"received"`
	Lost              []int    `json:"lost"`
	DuplicatesShown   int      `json:"duplicates_shown"`
	Redriven          int      `json:"redriven"`
	OK                bool     `json:"ok"`
	DuplicatesSkipped int      `json:"duplicates_skipped"`
	Unsent            int      `json:"unsent"`
	OrderViolations   []string `json:"order_violations"`
	Error             string   `json:"error,omitempty"`
	Measures
}

// NewResult is the Result of scenario name from its figures f and Run's
// error.
func NewResult(name string, f *probe.Figures, err error) Result {
	r := Result{Scenario: name, Sent: f.Saved, Received: f.Received, Lost: f.Lost,
		DuplicatesShown: f.DuplicatesShown, Redriven: f.Redriven, OK: err == nil,
		DuplicatesSkipped: f.DuplicatesSkipped, Unsent: f.Unsent, OrderViolations: f.OrderViolations}
	if r.Lost == nil {
		r.Lost = []int{}
	}
	if r.OrderViolations == nil {
		r.OrderViolations = []string{}
	}
	if err != nil {
		r.Error = err.Error()
	}
	return r
}

// relayCrash: the consumers relay SIGKILLs itself after publishing msg 3 and
// before its mark-sent commit; the lab restarts it without the fault; it
// publishes msg 3 again (an idempotent no-op) and marks it sent.
func relayCrash(ctx context.Context, s *run) error {
	relay := s.e.ConsumersRelays[0]
	done := s.restartAfterExit(ctx, relay, env.WithoutFlag(relay.Args(), "--fault"), "crashed between publish and commit")
	if err := s.sendEvery(ctx, 6, 300*time.Millisecond); err != nil {
		return err
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		s.extra = append(s.extra, "the relay did not crash (fault hook did not fire)")
	}
	return nil
}

// relayFreeze: two relays; one is SIGSTOPped while it holds a batch (an
// open transaction on the chat's outbox table: up to 20 tries, the relays
// in turn), and messages keep coming; the other must deliver everything,
// bounded by the frozen session's idle_in_transaction_session_timeout and
// the lock timeouts (and, with partitions, the frozen relay's leases).
func relayFreeze(ctx context.Context, s *run) error {
	relays := s.e.ConsumersRelays
	var frozen *process.Proc
	defer func() {
		if frozen != nil {
			_ = frozen.Signal(syscall.SIGCONT)
		}
	}()
	// To catch a relay holding a batch, Redis is paused: the relay that
	// claims the next message then waits in its publish with the rows
	// locked. One relay is frozen in that moment and Redis resumed; if the
	// rows stay locked, the frozen one was holding them (the other would
	// have finished once Redis answered). Otherwise it is thawed and the
	// lab tries again, freezing the relays in turn: at one partition each
	// claims first about half the time; with partitions only the holder of
	// the chat's partition's lease claims its row, and taking turns finds
	// it by the second try.
	holding := false
	var frozeAt time.Time
	const tries = 20
	for try := 0; try < tries && !holding; try++ {
		frozen = relays[try%len(relays)]
		if err := s.e.Redis.Pause(); err != nil {
			return err
		}
		s.send(ctx)
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		claimed := env.WaitFor(cctx, 5*time.Millisecond, func() bool { return s.lockedOutboxRows(cctx) > 0 }) == nil
		cancel()
		ferr := frozen.Signal(syscall.SIGSTOP)
		frozeAt = time.Now()
		if err := s.e.Redis.Resume(); err != nil {
			return err
		}
		if ferr != nil {
			return ferr
		}
		if claimed {
			time.Sleep(300 * time.Millisecond) // let the other relay finish, if it was the one
			holding = s.lockedOutboxRows(ctx) > 0
		}
		if !holding {
			if err := frozen.Signal(syscall.SIGCONT); err != nil {
				return err
			}
		}
	}
	if !holding {
		return fmt.Errorf("lab: relay-freeze: no relay held a batch in %d tries; the scenario did not run", tries)
	}
	s.log.Add("lab", "%s frozen (SIGSTOP) holding a batch", frozen.Name())
	if err := s.sendEvery(ctx, 3, 300*time.Millisecond); err != nil {
		return err
	}
	// The other relay must deliver within 10 s, bounded by the relay's
	// timeouts: the frozen session is ended by the server after
	// idle_in_transaction_session_timeout (outbox.DefaultIdleInTxTimeout,
	// 5 s), the other relay's claim gives up after lock_timeout (2 s) and
	// tries again. With partitions, the frozen relay also holds its
	// partitions' leases (chaos.Chat's among them, since it claimed its
	// row): the other relay runs them only once they run out, within 4/3
	// of the lease TTL (chat/lease), and then claims as above.
	bound := 10 * time.Second
	if s.e.Partitions > 1 {
		bound += lease.DefaultTTL * 4 / 3
	}
	wctx, cancel := context.WithDeadline(ctx, frozeAt.Add(bound))
	err := env.WaitFor(wctx, 50*time.Millisecond, func() bool { return probe.Settled(wctx, s.e, s.w) })
	cancel()
	if err != nil {
		s.extra = append(s.extra, fmt.Sprintf("not everything delivered within %v of the freeze", bound))
	} else {
		s.log.Add("lab", "everything delivered by the other relay, %.1fs after the freeze", time.Since(frozeAt).Seconds())
	}
	if err := frozen.Signal(syscall.SIGCONT); err != nil {
		return err
	}
	s.log.Add("lab", "%s continued (SIGCONT)", frozen.Name())
	return s.sendEvery(ctx, 2, 300*time.Millisecond)
}

// postgresRestart: Postgres stops while messages are being sent (the API
// answers 503 and stores nothing), then starts again; everything saved is
// delivered, and every saved message has exactly one outbox row.
func postgresRestart(ctx context.Context, s *run) error {
	if err := s.sendEvery(ctx, 3, 250*time.Millisecond); err != nil {
		return err
	}
	heal, err := s.inject(ctx, fault.Fault{Kind: fault.PostgresFast}, "postgres", "down")
	if err != nil {
		return err
	}
	if err := s.sendEvery(ctx, 3, 250*time.Millisecond); err != nil {
		return err
	}
	if err := s.heal(ctx, heal, "postgres", "up"); err != nil {
		return err
	}
	if err := s.sendEvery(ctx, 4, 250*time.Millisecond); err != nil {
		return err
	}
	// Nothing half-written: every outbox row has its message, and every
	// message has its outbox row or, once the relay published and deleted
	// the row, its inbox row on workers (waited for: it may be in flight).
	var orphans int
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	_ = env.WaitFor(wctx, 100*time.Millisecond, func() bool {
		err = s.e.Admin().QueryRow(wctx, `SELECT
		(SELECT count(*) FROM consumers.messages m WHERE NOT EXISTS
			(SELECT 1 FROM `+s.e.ConsumersOutbox()+` o WHERE o.payload->>'id' = m.id::text)
			AND NOT EXISTS (SELECT 1 FROM workers.inbox i WHERE i.message_id = m.id)) +
		(SELECT count(*) FROM `+s.e.ConsumersOutbox()+` o WHERE o.event = 'message.created' AND NOT EXISTS
			(SELECT 1 FROM consumers.messages m WHERE o.payload->>'id' = m.id::text))`).Scan(&orphans)
		return err == nil && orphans == 0
	})
	cancel()
	if err != nil && ctx.Err() == nil && orphans == 0 {
		return fmt.Errorf("lab: check half-writes: %w", err)
	}
	if orphans > 0 {
		s.extra = append(s.extra, fmt.Sprintf("%d message(s) or outbox row(s) without their pair", orphans))
	}
	return nil
}

// redisRestart: workers is stopped so jobs wait in the stream; Redis is
// SIGKILLed and restarted (the AOF is reloaded); workers comes back and
// shows every message.
func redisRestart(ctx context.Context, s *run) error {
	if err := s.sendEvery(ctx, 2, 250*time.Millisecond); err != nil {
		return err
	}
	startWorkers, err := s.stopWorkers(ctx)
	if err != nil {
		return err
	}
	if err := s.sendEvery(ctx, 4, 250*time.Millisecond); err != nil {
		return err
	}
	// Give the relay time to publish (the rows are marked sent) first.
	if err := s.allSent(ctx, 5*time.Second); err != nil {
		return errors.New("lab: the relay did not publish before the Redis kill")
	}
	healRedis, err := s.inject(ctx, fault.Fault{Kind: fault.RedisKill}, "redis", "killed (SIGKILL) with jobs queued for the stopped workers")
	if err != nil {
		return err
	}
	if err := s.heal(ctx, healRedis, "redis", "up (AOF reloaded)"); err != nil {
		return err
	}
	if err := startWorkers(ctx); err != nil {
		return err
	}
	return s.sendEvery(ctx, 2, 250*time.Millisecond)
}

// workerCrashBeforeCommit: workers SIGKILLs itself after reading msg 3 and
// before its inbox commit; a replacement instance (another consumer name,
// as after a reschedule) reclaims the job after the lock duration; msgs 4…
// wait behind the gap, so the chat's order holds.
func workerCrashBeforeCommit(ctx context.Context, s *run) error {
	p := s.e.Workers
	args := env.WithoutFlag(env.WithoutFlag(p.Args(), "--fault"), "--consumer-name")
	args = append(args, "--consumer-name", "workers-2")
	done := s.restartAfterExit(ctx, p, args, "crashed before the inbox commit; replaced by a new instance")
	if err := s.sendEvery(ctx, 6, 300*time.Millisecond); err != nil {
		return err
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		s.extra = append(s.extra, "workers did not crash (fault hook did not fire)")
	}
	return nil
}

// lockedOutboxRows returns how many unsent rows of the outbox chaos.Chat's
// events go to (its partition's) some session holds locked (unsent rows
// minus those FOR UPDATE SKIP LOCKED can take), or 0 on error.
func (s *run) lockedOutboxRows(ctx context.Context) int {
	// chat.OutboxTable's name is a schema and a table name: nothing to quote.
	t := chat.OutboxTable(chat.Consumers, s.partition())
	var locked int
	_ = pgx.BeginFunc(ctx, s.e.Admin(), func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+t+` WHERE sent_at IS NULL) -
			(SELECT count(*) FROM (SELECT 1 FROM `+t+` WHERE sent_at IS NULL FOR UPDATE SKIP LOCKED) t)`).Scan(&locked)
	})
	return locked
}
