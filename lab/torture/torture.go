package torture

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/lab/env"
	"github.com/outboxchat/outboxchat/lab/fault"
)

// Defaults.
const (
	// DefaultSchedules is how many schedules a run draws.
	DefaultSchedules = 10
	// DefaultDuration is how long each schedule's load and faults
	// last, before the faults stop and the system drains.
	DefaultDuration = 20 * time.Second
	// DefaultDrainBound is the bound the drain must finish within,
	// from the moment the last fault was healed: every 201 send in the
	// receiver's inbox and shown to every client of its chat, outbox and
	// streams empty. Why 60 s: the slowest healing path a schedule can
	// draw is a job whose worker died holding it (handed out again after
	// the lock duration, lockDuration) behind a relay that waits
	// out a frozen session (idle_in_transaction_session_timeout, 5 s) and
	// a re-drive (2 × lock duration), each of which may meet a fresh
	// reconnect backoff of the services (up to a few seconds); 60 s is
	// several times their sum and equals the gateway's gap timeout, after
	// which a client would see a held message out of order.
	DefaultDrainBound = 60 * time.Second
	// lockDuration is the services' lock duration in torture: short,
	// so that a stalled job comes back within a short schedule.
	lockDuration = 2 * time.Second
	// sendEvery is each sender goroutine's pause between sends.
	sendEvery = 40 * time.Millisecond
)

// Options configures Run. A zero field means its default.
type Options struct {
	// Schedules is how many schedules to run (1, 2, … Schedules). Default
	// DefaultSchedules.
	Schedules int
	// Seed seeds every schedule's draw: schedule K of seed S is the same
	// topology, load shape and fault sequence on every run (the
	// interleaving of real processes is not). 0 means 1.
	Seed uint64
	// Only runs schedule Only of Seed alone (a replay); 0 = all.
	Only int
	// Duration is each schedule's load-and-fault phase. Default
	// DefaultDuration.
	Duration time.Duration
	// DrainBound bounds each drain. Default DefaultDrainBound.
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
	// RedisCluster runs every schedule on a Redis Cluster of 3 masters and
	// 3 replicas (env.Options.RedisCluster) and draws cluster faults among
	// the others: a master killed and its replica promoted
	// (fault.ClusterFailover), a slot moved under load
	// (fault.ClusterReshard), a node paused (fault.ClusterPause). The
	// single-server Redis faults and the toxics on Redis links are not
	// drawn then. Default false: one Redis server.
	RedisCluster bool
	// Broker is the queue between the services: env.BrokerRedis (""; Redis
	// Streams) or env.BrokerNATS (JetStream on a private nats-server,
	// env.Options.Broker). With NATS the tap reads the JetStream streams,
	// the checker counts the dead letters of the JetStream dead-letter
	// streams, and the draw puts a nats-server SIGKILL (fault.NATSKill) or
	// graceful stop (fault.NATSStop) in place of half the Redis server
	// faults; Redis, which stays for the seq fence, presence and the live
	// hub, still takes the other half. The nats-server's links carry no
	// toxics. Not with RedisCluster.
	Broker string
	// Partitions runs every service process with --partitions Partitions
	// (env.Options.Partitions); the checker then reads every partition's
	// stream and outbox. It is not part of the draw: schedule K of a seed
	// is the same topology and faults whatever it is. Default 0: one.
	Partitions int
}

// Result is the `lab torture --json` object (DESIGN.md: schedules,
// failed, lost, duplicates_shown, order_violations, max_drain_s,
// failures), plus what was drawn.
type Result struct {
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
	// Changes is the number of messages edited or deleted (a 200 answer)
	// over all schedules; the checker compares every message's latest
	// version on both sides.
	Changes int `json:"changes"`
	// Faults counts the faults drawn, by kind.
	Faults map[string]int `json:"faults"`
	// Failures lists each failing schedule.
	Failures []Failure `json:"failures"`
	// Runs is one line of figures per schedule.
	Runs []ScheduleResult `json:"runs"`
}

// Failure is one failing schedule: replay it with
// `outboxchat lab torture --seed Seed --schedule Schedule`.
type Failure struct {
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
// the clients' reconnects, the checker's counts (as in Result),
// the dead letters found, the drain time in seconds, and what broke.
type ScheduleResult struct {
	Schedule   int      `json:"schedule"`
	Topology   string   `json:"topology"`
	Faults     []string `json:"faults"`
	Sent       int      `json:"sent"`
	Changes    int      `json:"changes"`
	Shown      int      `json:"shown"`
	Reconnects int      `json:"reconnects"`
	Lost       int      `json:"lost"`
	// PrunedUnseen counts (client, seq) never shown because a
	// prune-history fault deleted the message (delivered) before the
	// client, frozen or away, could show it: retention's contract, not a
	// loss.
	PrunedUnseen    int      `json:"pruned_unseen"`
	DuplicatesShown int      `json:"duplicates_shown"`
	OrderViolations int      `json:"order_violations"`
	DeadLetters     int      `json:"dead_letters"`
	DrainS          float64  `json:"drain_s"`
	OK              bool     `json:"ok"`
	Problems        []string `json:"problems,omitempty"`
}

// Run runs the schedules and returns their tally. An error means a run
// could not be set up at all (not an invariant broken: those are in the
// result, Failed > 0).
func Run(ctx context.Context, opts Options) (*Result, error) {
	if opts.Schedules <= 0 {
		opts.Schedules = DefaultSchedules
	}
	if opts.Seed == 0 {
		opts.Seed = 1
	}
	if opts.Duration <= 0 {
		opts.Duration = DefaultDuration
	}
	if opts.DrainBound <= 0 {
		opts.DrainBound = DefaultDrainBound
	}
	if opts.Progress == nil {
		opts.Progress = io.Discard
	}
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	switch opts.Broker {
	case "", env.BrokerRedis:
		opts.Broker = env.BrokerRedis
	case env.BrokerNATS:
		if opts.RedisCluster {
			return nil, errors.New("lab: torture: --broker nats runs on one Redis server, not with --redis-cluster")
		}
	default:
		return nil, fmt.Errorf("lab: torture: unknown broker %q (want redis or nats)", opts.Broker)
	}
	// The lab's own Redis client dials a Redis the schedule has stopped on
	// purpose; go-redis would print every failed dial.
	redis.SetLogger(quietRedis{})
	res := &Result{Seed: opts.Seed, Faults: map[string]int{}, Failures: []Failure{}}
	ks := make([]int, 0, opts.Schedules)
	if opts.Only > 0 {
		ks = append(ks, opts.Only)
	} else {
		for k := 1; k <= opts.Schedules; k++ {
			ks = append(ks, k)
		}
	}
	for _, k := range ks {
		s := draw(opts.Seed, k, opts.Duration, opts.RedisCluster, opts.Broker == env.BrokerNATS)
		s.Partitions = max(opts.Partitions, 1)
		s.Faults = dropFaults(s.Faults, opts.Drop)
		for _, f := range s.Faults {
			res.Faults[f.Family()]++
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
		res.Changes += r.Changes
		res.DuplicatesShown += r.DuplicatesShown
		res.OrderViolations += r.OrderViolations
		res.MaxDrainS = max(res.MaxDrainS, r.DrainS)
		status := "ok"
		if !r.OK {
			status = "FAILED: " + strings.Join(r.Problems, "; ")
		}
		fmt.Fprintf(opts.Progress, "torture schedule %d (%d of %d) seed %d: %s; faults: %s; sent %d, changed %d, shown %d, reconnects %d, drained in %.1fs: %s\n",
			k, res.Schedules, len(ks), opts.Seed, r.Topology, strings.Join(r.Faults, ", "), r.Sent, r.Changes, r.Shown, r.Reconnects, r.DrainS, status)
		if !r.OK {
			res.Failed++
			f := Failure{Seed: opts.Seed, Schedule: k, Problems: r.Problems}
			cluster := ""
			if opts.RedisCluster {
				cluster = " --redis-cluster"
			}
			if opts.Broker == env.BrokerNATS {
				cluster += " --broker nats"
			}
			if opts.Partitions > 1 {
				cluster += fmt.Sprintf(" --partitions %d", opts.Partitions)
			}
			fmt.Fprintf(opts.Progress, "torture: replay with: outboxchat lab torture%s --seed %d --schedule %d --duration %s\n", cluster, opts.Seed, k, opts.Duration)
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
func dropFaults(faults []fault.Fault, drop []int) []fault.Fault {
	var out []fault.Fault
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
func shrink(ctx context.Context, opts Options, s *schedule) string {
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
