package chaos

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/lab/env"
	"github.com/outboxchat/outboxchat/lab/fault"
	"github.com/outboxchat/outboxchat/lab/probe"
	"github.com/outboxchat/outboxchat/lab/process"
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
	// Chat is the chat the experiment (and every scenario) writes to.
	Chat = 1
	// crashSeq is the message after whose inbox commit workers crashes (v2).
	crashSeq = 2
)

// Options configures Run.
type Options struct {
	// Variant is env.VariantV1 or env.VariantV2 (default).
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
	// Broker is the queue between the services (env.Options.Broker):
	// env.BrokerRedis (default) or env.BrokerNATS. The outage before msg
	// 7 is the broker's: Redis, or the nats-server.
	Broker string
}

// Run runs the write-up's "Result" experiment on real processes and
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
func Run(ctx context.Context, opts Options) (*probe.Figures, error) {
	if opts.Variant == "" {
		opts.Variant = env.VariantV2
	}
	if opts.Variant != env.VariantV1 && opts.Variant != env.VariantV2 {
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
	v2 := opts.Variant == env.VariantV2
	eo := env.Options{Variant: opts.Variant, Progress: progress, Dir: opts.Dir, LockDuration: env.DefaultLockDuration, Broker: opts.Broker}
	if v2 {
		// "The relay is a process of its own."
		eo.ConsumersRelays = 1
		eo.Faults = map[string]string{env.ProcWorkers: fault.Spec(fault.WorkerAfterCommit, crashSeq)}
	}
	e, err := env.Start(ctx, eo)
	if err != nil {
		return nil, err
	}
	defer e.Close()

	log := probe.NewEventLog(opts.Log)
	events := probe.NewEvents()
	defer events.Close() // after the unsubscribes below (defers run last-in first-out)

	w, err := probe.NewWatcher(e.WorkersURL, Chat, &probe.WatcherConfig{Token: e.Token, OnFrame: probe.LogFrames(log, false)})
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
	defer e.Workers.Subscribe(func(l process.LogLine) {
		if !probe.LogDuplicate(ctx, e, log, events, l) && l.Event() == fault.EventCrash {
			crashMu.Lock()
			crashLabel = probe.LabelSeq(ctx, e, Chat, int64(l.Attrs["seq"].(float64)))
			crashMu.Unlock()
		}
	})()
	var relayMu sync.Mutex
	relayErrLogged := false
	if v2 {
		defer e.ConsumersRelays[0].Subscribe(func(l process.LogLine) {
			if l.Event() != string(outbox.EventPassFailed) {
				return
			}
			relayMu.Lock()
			first := !relayErrLogged
			relayErrLogged = true
			relayMu.Unlock()
			if first { // once per outage: the lab resets the flag when the relay restarts
				log.At(l.Time, "relay", "%s", l.Str("err"))
			}
		})()
	} else {
		defer e.Consumers.Subscribe(func(l process.LogLine) {
			switch l.Event() {
			case chat.EventV1AddFailed:
				id, msg := l.Str("message_id"), l.Str("err")
				events.Do(func() { log.At(l.Time, "consumers", "%s not queued, kept in memory: %s", probe.Label(ctx, e, id), msg) })
			case chat.EventV1Lost:
				log.At(l.Time, "consumers", "stopping with %s queue add(s) still in memory", l.Str("count"))
			}
		})()
	}

	if err := probe.Connect(ctx, w); err != nil {
		return nil, fmt.Errorf("lab: chaos: watcher could not connect to %s: %w", e.WorkersURL, err)
	}

	// v2: notice the workers' crash and start it again at once, without the
	// fault and with the same consumer name, so it reads its own pending
	// entry (msg 2) first and the inbox skips it.
	crashCtx, stopCrashWatch := context.WithCancel(ctx)
	var crashDone <-chan struct{}
	if v2 {
		crashDone = e.Workers.RestartOnExit(crashCtx, env.WithoutFlag(e.Workers.Args(), "--fault"), func() {
			crashMu.Lock()
			what := crashLabel
			crashMu.Unlock()
			if what != "" {
				log.Add("workers", "crashed after recording %s", what)
			} else {
				log.Add("workers", "exited unexpectedly")
			}
		}, func(err error) {
			if err != nil {
				log.Add("lab", "could not restart workers: %v", err)
				return
			}
			log.Add("deploy", "workers started again (no fault)")
		})
	} else {
		done := make(chan struct{})
		close(done)
		crashDone = done
	}
	defer func() { stopCrashWatch(); <-crashDone }()

	snd := probe.NewSender(e.Token)
	consumers := append([]*process.Proc{e.Consumers}, e.ConsumersRelays...)
	var healWorkers, healRedis env.Heal

	fmt.Fprintf(progress, "lab: chaos %s: sending %d messages, one every %v\n", opts.Variant, DefaultChaosMessages, DefaultChaosInterval)
	log.Start()
	next := time.Now()
	var lastSend time.Time
	for n := 1; n <= DefaultChaosMessages; n++ {
		if err := env.SleepUntil(ctx, next); err != nil {
			return nil, err
		}
		switch n {
		case 4: // workers redeploy: stopped just before msg 4
			if v2 {
				select {
				case <-crashDone:
				case <-time.After(5 * time.Second):
					log.Add("lab", "workers did not crash at msg %d (fault hook did not fire)", crashSeq)
					stopCrashWatch()
					<-crashDone
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			if healWorkers, err = e.Inject(ctx, fault.Fault{Kind: fault.Term, Target: env.ProcWorkers}); err != nil {
				return nil, err
			}
			log.Add("deploy", "workers stopped")
		case 7: // Redis down during msgs 7–8
			// The workers came back after msg 6: let them show and
			// acknowledge msgs 4–6 first (both variants: nothing is lost
			// yet), so the duplicates are the script's own (v2: the
			// crash's msg 2; v1: none). Without this wait, on a busy
			// machine Redis went down before the acks and 4–6 came
			// again as duplicates.
			_ = probe.WaitSettled(ctx, e, w, time.Now().Add(5*time.Second), 20*time.Millisecond)
			if healRedis, err = stopBroker(ctx, e); err != nil {
				return nil, err
			}
			log.Add(e.Broker, "down")
		case 9: // consumers (API and relay) redeployed while Redis is down
			if err := process.StopAll(ctx, consumers...); err != nil {
				return nil, err
			}
			log.Add("deploy", "consumers stopped")
			if err := healRedis(ctx); err != nil {
				return nil, err
			}
			log.Add(e.Broker, "up")
			relayMu.Lock()
			relayErrLogged = false
			relayMu.Unlock()
			if err := process.StartAll(ctx, consumers...); err != nil {
				return nil, err
			}
			log.Add("deploy", "consumers started")
		}
		lastSend = time.Now()
		next = lastSend.Add(DefaultChaosInterval)
		body := fmt.Sprintf("msg %d", n)
		if _, err := snd.Send(ctx, e.ConsumersURL, Chat, body); err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			log.Add("consumers", "%s not saved: %v", body, err)
		} else {
			log.Add("consumers", "%s saved", body)
		}
		if n == 6 { // workers comes back after msg 6
			if err := healWorkers(ctx); err != nil {
				return nil, err
			}
			log.Add("deploy", "workers started")
		}
	}

	fmt.Fprintf(progress, "lab: chaos %s: waiting up to %v for everything saved to be shown\n", opts.Variant, opts.Settle)
	if err := probe.WaitSettled(ctx, e, w, lastSend.Add(opts.Settle), 100*time.Millisecond); err != nil {
		return nil, err
	}
	<-crashDone
	return probe.ReadFigures(ctx, e, w)
}

// stopBroker stops the queue's server gracefully (Redis, or the
// nats-server of env.BrokerNATS) and returns what starts it again.
func stopBroker(ctx context.Context, e *env.Env) (env.Heal, error) {
	if e.NATS == nil { // Redis Streams
		return e.Inject(ctx, fault.Fault{Kind: fault.RedisStop})
	}
	if err := e.NATS.Stop(ctx); err != nil {
		return nil, fmt.Errorf("lab: chaos: stop nats-server: %w", err)
	}
	return e.NATS.Start, nil
}

// Expected checks a run of variant against the write-up's results: v1
// lost exactly msgs 7 and 8; v2 lost none, skipped exactly one duplicate
// and left nothing unsent. The error says what differs.
func Expected(variant string, f *probe.Figures) error {
	switch variant {
	case env.VariantV1:
		if !slices.Equal(f.Lost, []int{7, 8}) {
			return fmt.Errorf("chaos v1: want msgs 7 and 8 lost, got lost %v", f.Lost)
		}
	case env.VariantV2:
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
