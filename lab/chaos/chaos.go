package lab

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/internal/labfault"
	"github.com/outboxchat/outboxchat/outbox"
)

// Chaos defaults (the write-up's experiment).
const (
	// DefaultChaosMessages is how many messages consumers sends.
	DefaultChaosMessages = 10
	// DefaultChaosInterval is the pause between two sends.
	DefaultChaosInterval = 400 * time.Millisecond
	// DefaultChaosSettle is how long the run waits, after the last send,
	// for everything saved to be shown before it reports.
	DefaultChaosSettle = 15 * time.Second
	// chaosChat is the chat the experiment writes to.
	chaosChat = 1
	// crashSeq is the message after whose inbox commit workers crashes (v2).
	crashSeq = 2
)

// ChaosOptions configures Chaos.
type ChaosOptions struct {
	// Variant is VariantV1 or VariantV2 (default).
	Variant string
	// Log receives the event log ("  3.8s  deploy:    workers stopped").
	// nil discards it.
	Log io.Writer
	// Progress receives progress lines. nil discards them.
	Progress io.Writer
	// Settle bounds the final wait after the last send. Default
	// DefaultChaosSettle (15 s).
	Settle time.Duration
	// Dir keeps the process logs there ("" = temp dir, removed).
	Dir string
}

// Chaos runs the write-up's "Result" experiment on real processes and
// returns the figures read from the database and the WebSocket watcher:
//
//   - consumers API process, a separate consumers relay process (v2), the
//     workers process (api, worker and its own relay); a watcher on workers'
//     /ws for chat 1; lock duration 5 s;
//   - consumers sends "msg 1" … "msg 10" to chat 1, one every 400 ms;
//   - v2 only: workers runs with --fault worker-crash-after-commit:2 and
//     SIGKILLs itself after recording msg 2, before XACK; the lab restarts it
//     (same consumer name, no fault) and it finds its pending entry first,
//     so msg 2 comes back and is skipped as a duplicate;
//   - workers is redeployed (SIGTERM, start) around msgs 4–6;
//   - Redis is stopped before msg 7; after msg 8 consumers (API and relay)
//     is redeployed while Redis is still down; Redis is started again before
//     consumers comes back; msgs 9 and 10 follow;
//   - the run waits until everything saved has been shown, nothing is unsent
//     and no job is pending, or Settle after the last send.
//
// Expected: v1 loses msgs 7 and 8 (the API held their queue adds in memory
// when it was redeployed); v2 loses none, skips one duplicate, leaves nothing
// unsent. An error means the experiment could not run (not an unexpected
// result).
func Chaos(ctx context.Context, opts ChaosOptions) (*Figures, error) {
	if opts.Variant == "" {
		opts.Variant = VariantV2
	}
	if opts.Variant != VariantV1 && opts.Variant != VariantV2 {
		return nil, fmt.Errorf("lab: chaos: unknown variant %q (want v1 or v2)", opts.Variant)
	}
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	progress := opts.Progress
	if progress == nil {
		progress = io.Discard
	}
	if opts.Settle <= 0 {
		opts.Settle = DefaultChaosSettle
	}
	v2 := opts.Variant == VariantV2
	eo := EnvOptions{Variant: opts.Variant, Progress: progress, Dir: opts.Dir, LockDuration: DefaultLockDuration}
	if v2 {
		// "The relay is a process of its own."
		eo.ConsumersRelays = 1
		eo.Faults = map[string]string{ProcWorkers: fmt.Sprintf("%s:%d", labfault.WorkerAfterCommit, crashSeq)}
	}
	env, err := StartEnv(ctx, eo)
	if err != nil {
		return nil, err
	}
	defer env.Close()

	log := &eventLog{w: opts.Log}
	events := newAsyncEvents()
	defer events.close() // after the unsubscribes below (defers run last-in first-out)

	w, err := NewWatcher(env.WorkersURL, chaosChat, &WatcherConfig{Token: env.Token, OnFrame: func(s Shown) {
		if s.Message.From != chat.Consumers {
			return
		}
		if s.Duplicate {
			log.at(s.At, "workers", "%s shown AGAIN (shown twice)", s.Message.Body)
			return
		}
		log.at(s.At, "workers", "%s shown", s.Message.Body)
	}})
	if err != nil {
		return nil, err
	}
	if err := w.Start(ctx); err != nil {
		return nil, err
	}
	defer w.Stop(context.Background())

	// Log lines of the services that are events of the experiment.
	var crashMu sync.Mutex
	crashLabel := ""
	defer env.Workers.Subscribe(func(l LogLine) {
		switch l.Event() {
		case string(inbox.EventDuplicate):
			id := l.Str("message_id")
			events.do(func() { log.at(l.Time, "workers", "%s again, already in inbox, skipped", env.label(ctx, id)) })
		case labfault.EventCrash:
			crashMu.Lock()
			crashLabel = env.labelSeq(ctx, chaosChat, int64(l.Attrs["seq"].(float64)))
			crashMu.Unlock()
		}
	})()
	var relayMu sync.Mutex
	relayErrLogged := false
	if v2 {
		defer env.ConsumersRelays[0].Subscribe(func(l LogLine) {
			if l.Event() != string(outbox.EventPassFailed) {
				return
			}
			relayMu.Lock()
			first := !relayErrLogged
			relayErrLogged = true
			relayMu.Unlock()
			if first { // once per outage: the lab resets the flag when the relay restarts
				log.at(l.Time, "relay", "%s", l.Str("err"))
			}
		})()
	} else {
		defer env.Consumers.Subscribe(func(l LogLine) {
			switch l.Event() {
			case chat.EventV1AddFailed:
				id, e := l.Str("message_id"), l.Str("err")
				events.do(func() { log.at(l.Time, "consumers", "%s not queued, kept in memory: %s", env.label(ctx, id), e) })
			case chat.EventV1Lost:
				log.at(l.Time, "consumers", "stopping with %s queue add(s) still in memory", l.Str("count"))
			}
		})()
	}

	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = w.WaitConnected(wctx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("lab: chaos: watcher could not connect to %s: %w", env.WorkersURL, err)
	}

	// v2: notice the workers' crash and start it again at once, without the
	// fault and with the same consumer name, so it reads its own pending
	// entry (msg 2) first and the inbox skips it.
	crashCtx, stopCrashWatch := context.WithCancel(ctx)
	crashDone := make(chan struct{})
	if v2 {
		exited, _ := env.Workers.Exited()
		go func() {
			defer close(crashDone)
			select {
			case <-crashCtx.Done():
				return
			case <-exited:
			}
			crashMu.Lock()
			what := crashLabel
			crashMu.Unlock()
			if what != "" {
				log.add("workers", "crashed after recording %s", what)
			} else {
				log.add("workers", "exited unexpectedly")
			}
			env.Workers.SetArgs(withoutFlag(env.Workers.Args(), "--fault"))
			if err := env.Workers.StartReady(ctx); err != nil {
				log.add("lab", "could not restart workers: %v", err)
				return
			}
			log.add("deploy", "workers started again (no fault)")
		}()
	} else {
		close(crashDone)
	}
	defer func() { stopCrashWatch(); <-crashDone }()

	snd := newSender(env.Token)
	stopAll := func(ps ...*Proc) error {
		errs := make([]error, len(ps))
		var wg sync.WaitGroup
		for i, p := range ps {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = p.Stop(ctx) }()
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	startAll := func(ps ...*Proc) error {
		errs := make([]error, len(ps))
		var wg sync.WaitGroup
		for i, p := range ps {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = p.StartReady(ctx) }()
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	consumers := append([]*Proc{env.Consumers}, env.ConsumersRelays...)

	fmt.Fprintf(progress, "lab: chaos %s: sending %d messages, one every %v\n", opts.Variant, DefaultChaosMessages, DefaultChaosInterval)
	log.start()
	next := time.Now()
	var lastSend time.Time
	for n := 1; n <= DefaultChaosMessages; n++ {
		if err := sleepUntil(ctx, next); err != nil {
			return nil, err
		}
		switch n {
		case 4: // workers redeploy: stopped just before msg 4
			if v2 {
				select {
				case <-crashDone:
				case <-time.After(5 * time.Second):
					log.add("lab", "workers did not crash at msg %d (fault hook did not fire)", crashSeq)
					stopCrashWatch()
					<-crashDone
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			if err := env.Workers.Stop(ctx); err != nil {
				return nil, err
			}
			log.add("deploy", "workers stopped")
		case 7: // Redis down during msgs 7–8
			// The workers came back after msg 6: let them show and
			// acknowledge msgs 4–6 first (both variants: nothing is lost
			// yet), so the duplicates are the script's own (v2: the
			// crash's msg 2; v1: none). Without this wait, on a busy
			// machine Redis went down before the acks and 4–6 came
			// again as duplicates.
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_ = waitFor(wctx, 20*time.Millisecond, func() bool { return env.settled(wctx, w) })
			cancel()
			if err := env.Redis.Stop(ctx); err != nil {
				return nil, fmt.Errorf("lab: stop redis: %w", err)
			}
			log.add("redis", "down")
		case 9: // consumers (API and relay) redeployed while Redis is down
			if err := stopAll(consumers...); err != nil {
				return nil, err
			}
			log.add("deploy", "consumers stopped")
			if err := env.Redis.Restart(ctx); err != nil {
				return nil, fmt.Errorf("lab: start redis: %w", err)
			}
			log.add("redis", "up")
			relayMu.Lock()
			relayErrLogged = false
			relayMu.Unlock()
			if err := startAll(consumers...); err != nil {
				return nil, err
			}
			log.add("deploy", "consumers started")
		}
		lastSend = time.Now()
		next = lastSend.Add(DefaultChaosInterval)
		body := fmt.Sprintf("msg %d", n)
		if _, err := snd.send(ctx, env.ConsumersURL, chaosChat, body); err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			log.add("consumers", "%s not saved: %v", body, err)
		} else {
			log.add("consumers", "%s saved", body)
		}
		if n == 6 { // workers comes back after msg 6
			if err := env.Workers.StartReady(ctx); err != nil {
				return nil, err
			}
			log.add("deploy", "workers started")
		}
	}

	fmt.Fprintf(progress, "lab: chaos %s: waiting up to %v for everything saved to be shown\n", opts.Variant, opts.Settle)
	sctx, cancel := context.WithDeadline(ctx, lastSend.Add(opts.Settle))
	_ = waitFor(sctx, 100*time.Millisecond, func() bool { return env.settled(sctx, w) })
	cancel()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	<-crashDone
	return env.figures(ctx, w)
}

// withoutFlag returns args without flag name and its value.
func withoutFlag(args []string, name string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		if args[i] == name {
			i++
			continue
		}
		out = append(out, args[i])
	}
	return out
}

// sleepUntil sleeps until t or ctx ends.
func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-tm.C:
		return nil
	}
}

// runChaosCmd runs `lab chaos`.
func runChaosCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("lab chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	variant := fs.String("variant", VariantV2, "v1 (naive dual write) or v2 (transactional outbox)")
	asJSON := fs.Bool("json", false, "print one JSON object (saved, received, duplicates_skipped, lost, unsent); the event log goes to stderr")
	scenario := fs.String("scenario", "", "run a named scenario instead (see --list)")
	list := fs.Bool("list", false, "list the named scenarios")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("lab chaos: unexpected arguments %q", fs.Args())
	}
	if *list {
		for _, s := range scenarios {
			fmt.Fprintf(stdout, "%-28s %s\n", s.name, s.doc)
		}
		return nil
	}
	if *scenario != "" {
		return runScenarioCmd(ctx, *scenario, ScenarioOptions{}, *asJSON, stdout, stderr)
	}
	logW := stdout
	if *asJSON {
		logW = stderr
	}
	f, err := Chaos(ctx, ChaosOptions{Variant: *variant, Log: logW, Progress: stderr})
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(f)
	}
	fmt.Fprintln(stdout)
	f.WriteSummary(stdout)
	return nil
}

// chaosExpected checks a chaos run against the write-up's results.
func chaosExpected(variant string, f *Figures) error {
	switch variant {
	case VariantV1:
		if !slices.Equal(f.Lost, []int{7, 8}) {
			return fmt.Errorf("chaos v1: want msgs 7 and 8 lost, got lost %v", f.Lost)
		}
	case VariantV2:
		var bad []string
		if len(f.Lost) != 0 {
			bad = append(bad, fmt.Sprintf("lost %v, want none", f.Lost))
		}
		if f.DuplicatesSkipped != 1 {
			bad = append(bad, fmt.Sprintf("duplicates skipped %d, want 1", f.DuplicatesSkipped))
		}
		if f.Unsent != 0 {
			bad = append(bad, fmt.Sprintf("unsent %d, want 0", f.Unsent))
		}
		if len(bad) > 0 {
			return fmt.Errorf("chaos v2: %v", bad)
		}
	}
	return nil
}
