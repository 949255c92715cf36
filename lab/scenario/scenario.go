package lab

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/internal/labfault"
	"github.com/outboxchat/outboxchat/redisq"
)

// scenario is a named fault scenario of `lab chaos --scenario`.
type scenario struct {
	name, doc string
	run       func(ctx context.Context, s *scenarioRun) error
	opts      EnvOptions
}

// scenarios are listed by `lab chaos --list` in this order.
var scenarios = []scenario{
	{name: "relay-crash", doc: "the relay gets SIGKILL between its publish and its commit; restarted, it re-sends; nothing shown twice",
		opts: EnvOptions{ConsumersRelays: 1, Faults: map[string]string{"consumers-relay": labfault.RelayAfterPublish + ":3"}},
		run:  relayCrash},
	{name: "relay-freeze", doc: "two relays; one is frozen (SIGSTOP) while it holds a batch; the other delivers, bounded by the relay's timeouts",
		opts: EnvOptions{ConsumersRelays: 2}, run: relayFreeze},
	{name: "postgres-restart", doc: "Postgres restarts while messages are sent: 503s, nothing half-written; the relay re-LISTENs and catches up",
		run: postgresRestart},
	{name: "redis-restart", doc: "Redis is killed (SIGKILL) and restarted with jobs queued for a stopped worker: AOF keeps them",
		run: redisRestart},
	{name: "worker-crash-before-commit", doc: "the worker gets SIGKILL after reading a job, before its inbox commit; another worker reclaims it after the lock duration; order holds",
		opts: EnvOptions{Faults: map[string]string{ProcWorkers: labfault.WorkerBeforeCommit + ":3"}}, run: workerCrashBeforeCommit},
	{name: "redis-flush", doc: "workers stopped; 20 messages published and marked sent; FLUSHALL; workers started: the re-drive brings all 20, each shown once, in order",
		run: redisFlush},
	{name: "stream-entry-deleted", doc: "workers stopped; 2 messages published; a ghost consumer reads the first and its entry is XDELed; workers started: counted, re-driven, shown once, in order",
		run: streamEntryDeleted},
	{name: "redis-failover", doc: "Sentinel-managed primary + replica; the replica held back while 5 messages are published; primary killed, replica promoted without them: the re-drive brings them, each shown once, in order",
		opts: EnvOptions{Sentinel: true}, run: redisFailover},
}

// ScenarioNames returns the names of the named scenarios.
func ScenarioNames() []string {
	var out []string
	for _, s := range scenarios {
		out = append(out, s.name)
	}
	return out
}

// ErrInvariant is wrapped by RunScenario's error when a scenario ran but an
// invariant broke (something lost, shown twice, out of order, left unsent).
var ErrInvariant = errors.New("lab: invariant broken")

// scenarioRun is one scenario's environment, watcher and event log.
type scenarioRun struct {
	env      *Env
	w        *Watcher
	log      *eventLog
	snd      *sender
	events   *asyncEvents
	progress io.Writer
	sent     int
	lastSend time.Time
	extra    []string // extra invariant violations found by the scenario
}

// send sends "msg N" (N counting up) to chaosChat on consumers and logs it.
func (s *scenarioRun) send(ctx context.Context) {
	s.sent++
	body := fmt.Sprintf("msg %d", s.sent)
	s.lastSend = time.Now()
	if _, err := s.snd.send(ctx, s.env.ConsumersURL, chaosChat, body); err != nil {
		s.log.add("consumers", "%s not saved: %v", body, err)
		return
	}
	s.log.add("consumers", "%s saved", body)
}

// sendEvery sends n messages, one every interval.
func (s *scenarioRun) sendEvery(ctx context.Context, n int, interval time.Duration) error {
	for range n {
		if err := sleepUntil(ctx, s.lastSend.Add(interval)); err != nil {
			return err
		}
		s.send(ctx)
	}
	return nil
}

// restartAfterExit waits (in a goroutine the caller waits for through the
// returned channel) for p's current run to exit, logs it, and starts p again
// with the given args.
func (s *scenarioRun) restartAfterExit(ctx context.Context, p *Proc, args []string, what string) <-chan struct{} {
	exited, _ := p.Exited()
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-ctx.Done():
			return
		case <-exited:
		}
		s.log.add(p.Name(), "%s", what)
		p.SetArgs(args)
		if err := p.StartReady(ctx); err != nil {
			s.log.add("lab", "could not restart %s: %v", p.Name(), err)
			return
		}
		s.log.add("deploy", "%s started again", p.Name())
	}()
	return done
}

// ScenarioOptions adjusts a named scenario's run.
type ScenarioOptions struct {
	// ExtraArgs are appended to every serve command line (e.g.
	// "--redrive-after", "0" to show what the re-drive heals).
	ExtraArgs []string
}

// RunScenario runs the named scenario and returns its figures, or an error
// wrapping ErrInvariant when it ran but an invariant broke (the figures are
// returned too), or another error when it could not run.
func RunScenario(ctx context.Context, name string, logW, progress io.Writer) (*Figures, error) {
	return RunScenarioWith(ctx, name, ScenarioOptions{}, logW, progress)
}

// RunScenarioWith is RunScenario with options.
func RunScenarioWith(ctx context.Context, name string, so ScenarioOptions, logW, progress io.Writer) (*Figures, error) {
	var sc *scenario
	for i := range scenarios {
		if scenarios[i].name == name {
			sc = &scenarios[i]
		}
	}
	if sc == nil {
		return nil, fmt.Errorf("lab: unknown scenario %q (see lab chaos --list)", name)
	}
	if logW == nil {
		logW = io.Discard
	}
	if progress == nil {
		progress = io.Discard
	}
	opts := sc.opts
	opts.Progress = progress
	opts.ExtraArgs = append(append([]string(nil), opts.ExtraArgs...), so.ExtraArgs...)
	env, err := StartEnv(ctx, opts)
	if err != nil {
		return nil, err
	}
	defer env.Close()
	s := &scenarioRun{env: env, log: &eventLog{w: logW}, snd: newSender(env.Token), events: newAsyncEvents(), progress: progress}
	defer s.events.close()
	s.w, err = NewWatcher(env.WorkersURL, chaosChat, &WatcherConfig{Token: env.Token, OnFrame: func(f Shown) {
		if f.Message.From != chat.Consumers {
			return
		}
		switch {
		case f.Duplicate:
			s.log.at(f.At, "workers", "%s shown AGAIN (shown twice)", f.Message.Body)
		case f.OutOfOrder:
			s.log.at(f.At, "workers", "%s shown OUT OF ORDER", f.Message.Body)
		default:
			s.log.at(f.At, "workers", "%s shown", f.Message.Body)
		}
	}})
	if err != nil {
		return nil, err
	}
	if err := s.w.Start(ctx); err != nil {
		return nil, err
	}
	defer s.w.Stop(context.Background())
	defer env.Workers.Subscribe(func(l LogLine) {
		switch l.Event() {
		case string(inbox.EventDuplicate):
			id := l.Str("message_id")
			s.events.do(func() { s.log.at(l.Time, "workers", "%s again, already in inbox, skipped", env.label(ctx, id)) })
		case string(redisq.EventReclaimed):
			s.log.at(l.Time, "workers", "reclaimed %s stalled job(s) after the lock duration", l.Str("count"))
		case labfault.EventCrash:
			s.log.at(l.Time, "workers", "fault injected: crashing (%s)", l.Str("fault"))
		case string(redisq.EventDeletedPending):
			s.log.at(l.Time, "workers", "pending entry %s found deleted from the stream: counted, acknowledged away", l.Str("stream_id"))
		case string(redisq.EventGroupLost):
			s.log.at(l.Time, "workers", "consumer group gone (NOGROUP): created again from 0")
		}
	})()
	defer env.Consumers.Subscribe(func(l LogLine) {
		if l.Event() == chat.EventRedriven {
			s.log.at(l.Time, "consumers", "seq %s (message %s) had no receipt: re-driven", l.Str("seq"), l.Str("message_id"))
		}
	})()
	for _, p := range env.ConsumersRelays {
		defer p.Subscribe(func(l LogLine) {
			if l.Event() == labfault.EventCrash {
				s.log.at(l.Time, p.Name(), "fault injected: crashing (%s)", l.Str("fault"))
			}
		})()
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = s.w.WaitConnected(wctx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("lab: watcher could not connect: %w", err)
	}
	fmt.Fprintf(progress, "lab: scenario %s\n", name)
	s.log.start()
	s.lastSend = time.Now().Add(-time.Hour)
	if err := sc.run(ctx, s); err != nil {
		return nil, err
	}
	settle := 2*env.LockDuration + 10*time.Second
	fmt.Fprintf(progress, "lab: waiting up to %v for everything saved to be shown\n", settle)
	sctx, cancel := context.WithDeadline(ctx, s.lastSend.Add(settle))
	_ = waitFor(sctx, 100*time.Millisecond, func() bool { return env.settled(sctx, s.w) })
	cancel()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	f, err := env.figures(ctx, s.w)
	if err != nil {
		return nil, err
	}
	err = f.CheckInvariants()
	if len(s.extra) > 0 {
		err = errors.Join(err, fmt.Errorf("%v", s.extra))
	}
	if err != nil {
		return f, fmt.Errorf("%w: scenario %s: %w", ErrInvariant, name, err)
	}
	return f, nil
}

// ScenarioResult is the `lab scenario NAME --json` object (DESIGN.md):
// the scenario's name, messages sent (saved by consumers), received (shown
// at the workers' WebSocket client), lost (seqs saved and never shown; []
// when none), duplicates shown, messages re-driven (sum of
// consumers.messages.redrives) and ok (every invariant held); plus the
// chaos figures.
type ScenarioResult struct {
	Scenario          string   `json:"scenario"`
	Sent              int      `json:"sent"`
	Received          int      `json:"received"`
	Lost              []int    `json:"lost"`
	DuplicatesShown   int      `json:"duplicates_shown"`
	Redriven          int      `json:"redriven"`
	OK                bool     `json:"ok"`
	DuplicatesSkipped int      `json:"duplicates_skipped"`
	Unsent            int      `json:"unsent"`
	OrderViolations   []string `json:"order_violations,omitempty"`
	Error             string   `json:"error,omitempty"`
}

func runScenarioCmd(ctx context.Context, name string, so ScenarioOptions, asJSON bool, stdout, stderr io.Writer) error {
	logW := stdout
	if asJSON {
		logW = stderr
	}
	f, err := RunScenarioWith(ctx, name, so, logW, stderr)
	if f != nil {
		if asJSON {
			r := ScenarioResult{Scenario: name, Sent: f.Saved, Received: f.Received, Lost: f.Lost,
				DuplicatesShown: f.DuplicatesShown, Redriven: f.Redriven, OK: err == nil,
				DuplicatesSkipped: f.DuplicatesSkipped, Unsent: f.Unsent, OrderViolations: f.OrderViolations}
			if r.Lost == nil {
				r.Lost = []int{}
			}
			if err != nil {
				r.Error = err.Error()
			}
			_ = json.NewEncoder(stdout).Encode(r)
		} else {
			fmt.Fprintln(stdout)
			f.WriteSummary(stdout)
			fmt.Fprintf(stdout, "shown twice: %d   order violations: %d   re-driven: %d\n", f.DuplicatesShown, len(f.OrderViolations), f.Redriven)
		}
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(logW, "invariants hold: nothing lost, nothing shown twice, order kept")
	return nil
}

// runScenarioSubcmd runs `lab scenario NAME [--json] [--redrive-after D]`.
func runScenarioSubcmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("lab scenario", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print one JSON object (scenario, sent, received, lost, duplicates_shown, redriven, ok, …); the event log goes to stderr")
	redrive := fs.String("redrive-after", "", "pass --redrive-after to the services (0 = re-drive off: shows what Redis lost)")
	list := fs.Bool("list", false, "list the named scenarios")
	// NAME may come before or after the flags.
	var name string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *list {
		for _, s := range scenarios {
			fmt.Fprintf(stdout, "%-28s %s\n", s.name, s.doc)
		}
		return nil
	}
	if name == "" && fs.NArg() == 1 {
		name = fs.Arg(0)
	} else if fs.NArg() > 0 {
		return fmt.Errorf("lab scenario: unexpected arguments %q", fs.Args())
	}
	if name == "" {
		return fmt.Errorf("lab scenario: name a scenario (one of %s)", strings.Join(ScenarioNames(), ", "))
	}
	var so ScenarioOptions
	if *redrive != "" {
		so.ExtraArgs = []string{"--redrive-after", *redrive}
	}
	return runScenarioCmd(ctx, name, so, *asJSON, stdout, stderr)
}

func init() { extraCommands["scenario"] = runScenarioSubcmd }

// relayCrash: the consumers relay SIGKILLs itself after publishing msg 3 and
// before its mark-sent commit; the lab restarts it without the fault; it
// publishes msg 3 again (an idempotent no-op) and marks it sent.
func relayCrash(ctx context.Context, s *scenarioRun) error {
	relay := s.env.ConsumersRelays[0]
	done := s.restartAfterExit(ctx, relay, withoutFlag(relay.Args(), "--fault"), "crashed between publish and commit")
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

// relayFreeze: two relays; relay 1 is SIGSTOPped, ideally while it holds a
// batch (an open transaction on the outbox: up to 20 tries), and messages
// keep coming; relay 2 must deliver everything, bounded by the frozen
// session's idle_in_transaction_session_timeout and the lock timeouts.
func relayFreeze(ctx context.Context, s *scenarioRun) error {
	frozen := s.env.ConsumersRelays[0]
	defer func() { _ = frozen.Signal(syscall.SIGCONT) }()
	// To catch a relay holding a batch, Redis is paused: the relay that
	// claims the next message then waits in its publish with the rows
	// locked. Relay 1 is frozen in that moment and Redis resumed; if the
	// rows stay locked, relay 1 was the one holding them (relay 2 would
	// have finished once Redis answered). Otherwise relay 1 is thawed and
	// the lab tries again; each relay claims first about half the time.
	holding := false
	var frozeAt time.Time
	const tries = 20
	for try := 0; try < tries && !holding; try++ {
		if err := s.env.Redis.Pause(); err != nil {
			return err
		}
		s.send(ctx)
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		claimed := waitFor(cctx, 5*time.Millisecond, func() bool { return lockedOutboxRows(cctx, s.env) > 0 }) == nil
		cancel()
		ferr := frozen.Signal(syscall.SIGSTOP)
		frozeAt = time.Now()
		if err := s.env.Redis.Resume(); err != nil {
			return err
		}
		if ferr != nil {
			return ferr
		}
		if claimed {
			time.Sleep(300 * time.Millisecond) // let relay 2 finish, if it was the one
			holding = lockedOutboxRows(ctx, s.env) > 0
		}
		if !holding {
			if err := frozen.Signal(syscall.SIGCONT); err != nil {
				return err
			}
		}
	}
	if !holding {
		return fmt.Errorf("lab: relay-freeze: %s never held a batch in %d tries; the scenario did not run", frozen.Name(), tries)
	}
	s.log.add("lab", "%s frozen (SIGSTOP) holding a batch", frozen.Name())
	if err := s.sendEvery(ctx, 3, 300*time.Millisecond); err != nil {
		return err
	}
	// The other relay must deliver within 10 s, bounded by the relay's
	// timeouts: the frozen session is ended by the server after
	// idle_in_transaction_session_timeout (outbox.DefaultIdleInTxTimeout,
	// 5 s), the other relay's claim gives up after lock_timeout (2 s) and
	// tries again.
	const bound = 10 * time.Second
	wctx, cancel := context.WithDeadline(ctx, frozeAt.Add(bound))
	err := waitFor(wctx, 50*time.Millisecond, func() bool { return s.env.settled(wctx, s.w) })
	cancel()
	if err != nil {
		s.extra = append(s.extra, fmt.Sprintf("not everything delivered within %v of the freeze", bound))
	} else {
		s.log.add("lab", "everything delivered by the other relay, %.1fs after the freeze", time.Since(frozeAt).Seconds())
	}
	if err := frozen.Signal(syscall.SIGCONT); err != nil {
		return err
	}
	s.log.add("lab", "%s continued (SIGCONT)", frozen.Name())
	return s.sendEvery(ctx, 2, 300*time.Millisecond)
}

// postgresRestart: Postgres stops while messages are being sent (the API
// answers 503 and stores nothing), then starts again; everything saved is
// delivered, and every saved message has exactly one outbox row.
func postgresRestart(ctx context.Context, s *scenarioRun) error {
	if err := s.sendEvery(ctx, 3, 250*time.Millisecond); err != nil {
		return err
	}
	if err := s.env.Postgres.Stop(ctx); err != nil {
		return fmt.Errorf("lab: stop postgres: %w", err)
	}
	s.log.add("postgres", "down")
	if err := s.sendEvery(ctx, 3, 250*time.Millisecond); err != nil {
		return err
	}
	if err := s.env.Postgres.Restart(ctx); err != nil {
		return fmt.Errorf("lab: restart postgres: %w", err)
	}
	s.log.add("postgres", "up")
	if err := s.sendEvery(ctx, 4, 250*time.Millisecond); err != nil {
		return err
	}
	// Nothing half-written: every outbox row has its message, and every
	// message has its outbox row or, once the relay published and deleted
	// the row, its inbox row on workers (waited for: it may be in flight).
	var orphans int
	var err error
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	_ = waitFor(wctx, 100*time.Millisecond, func() bool {
		err = s.env.admin.QueryRow(wctx, `SELECT
		(SELECT count(*) FROM consumers.messages m WHERE NOT EXISTS
			(SELECT 1 FROM consumers.outbox o WHERE o.payload->>'id' = m.id::text)
			AND NOT EXISTS (SELECT 1 FROM workers.inbox i WHERE i.message_id = m.id)) +
		(SELECT count(*) FROM consumers.outbox o WHERE o.event = 'message.created' AND NOT EXISTS
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
func redisRestart(ctx context.Context, s *scenarioRun) error {
	if err := s.sendEvery(ctx, 2, 250*time.Millisecond); err != nil {
		return err
	}
	if err := s.env.Workers.Stop(ctx); err != nil {
		return err
	}
	s.log.add("deploy", "workers stopped")
	if err := s.sendEvery(ctx, 4, 250*time.Millisecond); err != nil {
		return err
	}
	// Give the relay time to publish (the rows are marked sent) first.
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err := waitFor(wctx, 50*time.Millisecond, func() bool {
		var n int
		return s.env.admin.QueryRow(wctx, `SELECT count(*) FROM consumers.outbox WHERE sent_at IS NULL`).Scan(&n) == nil && n == 0
	})
	cancel()
	if err != nil {
		return errors.New("lab: the relay did not publish before the Redis kill")
	}
	if err := s.env.Redis.Kill(); err != nil {
		return fmt.Errorf("lab: kill redis: %w", err)
	}
	s.log.add("redis", "killed (SIGKILL) with jobs queued for the stopped workers")
	if err := s.env.Redis.Restart(ctx); err != nil {
		return fmt.Errorf("lab: restart redis: %w", err)
	}
	s.log.add("redis", "up (AOF reloaded)")
	if err := s.env.Workers.StartReady(ctx); err != nil {
		return err
	}
	s.log.add("deploy", "workers started")
	return s.sendEvery(ctx, 2, 250*time.Millisecond)
}

// workerCrashBeforeCommit: workers SIGKILLs itself after reading msg 3 and
// before its inbox commit; a replacement instance (another consumer name,
// as after a reschedule) reclaims the job after the lock duration; msgs 4…
// wait behind the gap, so the chat's order holds.
func workerCrashBeforeCommit(ctx context.Context, s *scenarioRun) error {
	p := s.env.Workers
	args := withoutFlag(withoutFlag(p.Args(), "--fault"), "--consumer-name")
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

// lockedOutboxRows returns how many unsent consumers' outbox rows some
// session holds locked (unsent rows minus those FOR UPDATE SKIP LOCKED can
// take), or 0 on error.
func lockedOutboxRows(ctx context.Context, env *Env) int {
	var locked int
	_ = pgx.BeginFunc(ctx, env.admin, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM consumers.outbox WHERE sent_at IS NULL) -
			(SELECT count(*) FROM (SELECT 1 FROM consumers.outbox WHERE sent_at IS NULL FOR UPDATE SKIP LOCKED) t)`).Scan(&locked)
	})
	return locked
}
