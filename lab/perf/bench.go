package perf

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/lab/env"
	"github.com/outboxchat/outboxchat/lab/fault"
	"github.com/outboxchat/outboxchat/lab/probe"
	"github.com/outboxchat/outboxchat/redisq"
)

// Bench defaults.
const (
	// DefaultBenchSenders is the number of concurrent senders.
	DefaultBenchSenders = 16
	// DefaultBenchChats is the number of chats the messages are spread over
	// (one watcher each).
	DefaultBenchChats = 100
	// DefaultBenchMessages is the number of messages sent.
	DefaultBenchMessages = 20000
	// DefaultBenchSendTimeout bounds the sending phase; senders stop when
	// it ends and the report covers what was sent.
	DefaultBenchSendTimeout = 5 * time.Minute
	// DefaultBenchDrain bounds the wait, after the last send, for every
	// sent message to be shown; what is not shown by then is lost.
	DefaultBenchDrain = 60 * time.Second
	// DefaultBenchTrimWait bounds the wait, once drained, for the stream to
	// be trimmed before Redis memory is read again.
	DefaultBenchTrimWait = 5 * time.Second
	// benchWaitSample is how often pg_stat_activity is sampled.
	benchWaitSample = 50 * time.Millisecond
)

// BenchOptions configures Bench. A zero field means its default.
type BenchOptions struct {
	// Senders is the number of concurrent senders, each a closed loop of
	// HTTP POSTs on keep-alive connections. Default DefaultBenchSenders (16).
	Senders int
	// Chats the messages are spread over round-robin; the workers service
	// gets one WebSocket watcher per chat. Default DefaultBenchChats (100).
	Chats int
	// Messages to send. Default DefaultBenchMessages (20000).
	Messages int
	// Variant of the environment. Default env.VariantV2.
	Variant string
	// Partitions is both services' --partitions (env.Options.Partitions).
	// Default 0 or 1: one lane.
	Partitions int
	// RedisLatency, when above 0, routes each service's connections to
	// Redis and Postgres through toxiproxy links in the lab's process
	// (env.Links) and delays every reply from Redis by RedisLatency: one
	// round trip between a service and Redis takes RedisLatency more, as
	// across a network. Postgres's links stay without a toxic. Default 0:
	// direct connections.
	RedisLatency time.Duration
	// SendTimeout bounds sending; Drain the wait for the last messages.
	// Defaults DefaultBenchSendTimeout (5 min) and DefaultBenchDrain (60 s).
	SendTimeout, Drain time.Duration
	// ProgressEvery is the interval of progress lines. Default 1 s.
	ProgressEvery time.Duration
	// Progress receives progress lines. nil discards them.
	Progress io.Writer
	// HoldSnapshot, when true, opens a REPEATABLE READ transaction on a
	// connection of its own before the first send, reads consumers.outbox in
	// it (so it holds a snapshot, and with it the database's xmin horizon)
	// and keeps it open, idle, until the run has drained: the forgotten
	// psql session. Default false.
	HoldSnapshot bool
	// Insecure runs the services without auth and signed stream entries
	// (EnvOptions.Insecure), to measure what they cost.
	Insecure bool
	// PgBouncer runs the services through a private PgBouncer in
	// transaction mode (EnvOptions.PgBouncer).
	PgBouncer bool
	// Retention, when above 0, runs the services with
	// --history-retention Retention, so that the bench measures the
	// retention service pruning under load. Default 0: keep everything.
	Retention time.Duration
	// Durable runs the servers flushing every commit (env.Options.Durable:
	// Postgres fsync=on); default false, the fast mode (fsync=off).
	Durable bool
	// ProfileDir, when set, gives the services pprof listeners
	// (env.Options.Debug) and writes into it, from DefaultProfileDelay
	// (2 s) after the first send, a CPU profile of ProfileSeconds of every
	// service process with an allocation profile before and after it
	// (profileWindow). Default "": no profiles.
	ProfileDir string
	// ProfileSeconds is the CPU profile's length. Default
	// DefaultProfileSeconds (10).
	ProfileSeconds int
	// Counts, when true, preloads pg_stat_statements in the lab's Postgres
	// and counts, from just before the first send to the end of the
	// drain, the services' statements and every Redis command
	// (BenchResult.Counts). Default false.
	Counts bool
	// Transport is how the senders send: TransportHTTP (a POST per
	// message; the default for "") or TransportWS (a socket per sender,
	// a send frame per message, acked).
	Transport string
	// Broker is the queue between the services (env.Options.Broker):
	// env.BrokerRedis (the default for "") or env.BrokerNATS.
	Broker string
}

// BenchResult is what Bench measured. The JSON fields are DESIGN.md's
// (plus cpu_s); the others are printed by WriteText.
type BenchResult struct {
	Senders  int `json:"senders"`
	Chats    int `json:"chats"`
	Messages int `json:"messages"`
	// DurationS is from the first send's start to the last message shown.
	DurationS float64 `json:"duration_s"`
	// ThroughputMsgsPerS is messages shown per second over DurationS.
	ThroughputMsgsPerS float64 `json:"throughput_msgs_per_s"`
	// P50Ms, P95Ms, P99Ms: latency (send call start → frame at a workers
	// WebSocket client) of the messages shown.
	P50Ms float64 `json:"p50_ms"`
	P95Ms float64 `json:"p95_ms"`
	P99Ms float64 `json:"p99_ms"`
	// Lost is the number of sends answered 201 whose message was not shown
	// by the end of the drain.
	Lost int `json:"lost"`
	// DuplicatesShown is the number of frames that showed a message again.
	DuplicatesShown int `json:"duplicates_shown"`
	// RSSMB maps each service process to its peak RSS (VmHWM) in MB.
	RSSMB map[string]float64 `json:"rss_mb"`
	// RedisUsedMBBefore is Redis used_memory before the first send;
	// RedisUsedMBAfter once drained and trimmed (MB = 2^20 bytes).
	RedisUsedMBBefore float64 `json:"redis_used_mb_before"`
	RedisUsedMBAfter  float64 `json:"redis_used_mb_after"`
	// CPUS maps each process (the services, "postgres" with all its
	// backends, "redis", and "lab": this process, whose senders and
	// watchers share the machine with the rest) to the CPU seconds it used
	// from the first send to the end of the drain.
	CPUS map[string]float64 `json:"cpu_s"`

	// Sent is the number of sends answered 201 (acked over ws);
	// SendErrors the others.
	Sent       int `json:"-"`
	SendErrors int `json:"-"`
	// FirstSendError is the first send error seen ("" when none).
	FirstSendError string `json:"-"`
	// SendRate is 201s per second from the first send to the last reply.
	SendRate float64 `json:"-"`
	// SendP50Ms is the p50 of the send call alone (the HTTP request, or
	// the send frame to its ack).
	SendP50Ms float64 `json:"-"`
	// Wall is the measured window (first send → drained), for CPU shares.
	Wall time.Duration `json:"-"`
	// StreamLenAfter and RedisKeysAfter describe Redis after the run:
	// entries left in the consumers→workers stream and keys in the db.
	StreamLenAfter, RedisKeysAfter int64 `json:"-"`
	// PGWaits are the most frequent (role, state, wait event) of non-idle
	// client backends, sampled every 50 ms during the run.
	PGWaits []WaitCount `json:"-"`
	// PGWaitSamples is the number of pg_stat_activity samples taken.
	PGWaitSamples int `json:"-"`
	// MaxUnsent and MaxPending are the largest backlogs the progress lines
	// saw: unsent consumers.outbox rows, and queue entries not yet
	// acknowledged by the workers' group (lag + pending).
	MaxUnsent, MaxPending int64 `json:"-"`
	// Stages are the p50s of the three legs (see LatencyRun.Stages).
	Stages probe.Stages `json:"-"`
	// TailStages are the legs' medians over the messages at or above the
	// p99: where the tail's time goes.
	TailStages probe.Stages `json:"-"`
	// SlowSeconds are the (up to 5) one-second windows, by send start,
	// with the highest p99, worst first: a tail that recurs at a period
	// shows here.
	SlowSeconds []SlowSecond `json:"-"`
	// HoldSnapshot echoes BenchOptions.HoldSnapshot.
	HoldSnapshot bool `json:"hold_snapshot"`
	// Durable echoes BenchOptions.Durable: true when Postgres ran with
	// fsync=on, false in the fast mode (fsync=off).
	Durable bool `json:"durable"`
	// WindowsMsgsPerS is the rate of messages shown in each successive
	// 10 s window from the first send (the last window may be shorter; it
	// is dropped when under 2 s), in msg/s.
	WindowsMsgsPerS []float64 `json:"windows_msgs_per_s"`
	// Tables is pg_stat_user_tables of the services' tables at the end of
	// the run (after the drain, before the held snapshot is released); its
	// counts may miss up to the run's last 10 s (tableStats).
	Tables []TableStat `json:"tables"`
	// OutboxBytesBefore and OutboxBytesAfter are pg_total_relation_size
	// (heap, indexes, TOAST) of each service's outbox tables, every
	// partition's (chat.OutboxTable), before the first send and after the
	// drain and Redis trim.
	OutboxBytesBefore map[string]int64 `json:"outbox_bytes_before"`
	OutboxBytesAfter  map[string]int64 `json:"outbox_bytes_after"`
	// Counts are the statements and Redis commands of the run
	// (BenchOptions.Counts; nil without it), by who, most frequent first.
	Counts []WorkCount `json:"counts,omitempty"`
	// Transport echoes BenchOptions.Transport ("http" or "ws").
	Transport string `json:"transport"`
	// Broker echoes BenchOptions.Broker ("redis" or "nats").
	Broker string `json:"broker"`
}

// outboxTables returns both services' outbox tables at n partitions
// (chat.OutboxTable), consumers' first, each in partition order.
func outboxTables(n int) []string {
	var ts []string
	for _, svc := range []string{chat.Consumers, chat.Workers} {
		for p := range max(n, 1) {
			ts = append(ts, chat.OutboxTable(svc, p))
		}
	}
	return ts
}

// outboxBytes reads pg_total_relation_size of both services' outbox tables,
// every partition's (nil if it cannot).
func outboxBytes(ctx context.Context, e *env.Env) map[string]int64 {
	out := map[string]int64{}
	for _, t := range outboxTables(e.Partitions) {
		var n int64
		if err := e.Admin().QueryRow(ctx, "SELECT pg_total_relation_size($1::regclass)", t).Scan(&n); err != nil {
			return nil
		}
		out[t] = n
	}
	return out
}

// benchWindow is the width of BenchResult.WindowsMsgsPerS's windows.
const benchWindow = 10 * time.Second

// TableStat is one row of pg_stat_user_tables: dead and live tuples, and
// the cumulative inserts, updates (HOT among them) and deletes.
type TableStat struct {
	Table     string `json:"table"`
	DeadTup   int64  `json:"n_dead_tup"`
	LiveTup   int64  `json:"n_live_tup"`
	Ins       int64  `json:"n_tup_ins"`
	Upd       int64  `json:"n_tup_upd"`
	HotUpd    int64  `json:"n_tup_hot_upd"`
	Del       int64  `json:"n_tup_del"`
	Autovac   int64  `json:"autovacuum_count"`
	SizeBytes int64  `json:"total_bytes"`
}

// SlowSecond is one second of a bench run, by send start: its offset
// from the first send, its p99 latency and messages sent then.
type SlowSecond struct {
	AtS   int
	P99Ms float64
	N     int
}

// WaitCount is how often one (role, state, wait event) was seen across the
// pg_stat_activity samples, summed over backends.
type WaitCount struct {
	Key   string
	Count int
}

// Bench runs sustained load through the whole pipeline on a fresh
// environment: Senders closed-loop senders POST Messages messages to
// consumers, spread over Chats chats, while one WebSocket watcher per chat
// on workers records each frame's arrival. It measures throughput, latency,
// loss, duplicates, per-process CPU and peak RSS, Redis memory before and
// after, and samples pg_stat_activity. Progress lines go to Progress every
// ProgressEvery. An error means the bench could not run.
func Bench(ctx context.Context, opts BenchOptions) (*BenchResult, error) {
	opts = benchDefaults(opts)
	if opts.Transport != TransportHTTP && opts.Transport != TransportWS {
		return nil, fmt.Errorf("lab bench: transport %q: want %s or %s", opts.Transport, TransportHTTP, TransportWS)
	}
	progress := opts.Progress
	if progress == nil {
		progress = io.Discard
	}
	e, closeEnv, err := benchEnv(ctx, opts, progress)
	if err != nil {
		return nil, err
	}
	defer closeEnv()
	res := &BenchResult{Senders: opts.Senders, Chats: opts.Chats, Messages: opts.Messages,
		RSSMB: map[string]float64{}, CPUS: map[string]float64{}, Durable: opts.Durable, Transport: opts.Transport, Broker: e.Broker}

	// Watchers: one per chat; arrivals by message id.
	var got arrivals
	got.m = make(map[string]probe.Shown, opts.Messages)
	watchers, err := startWatchers(ctx, e, opts.Chats, &got)
	defer func() {
		for _, w := range watchers {
			w.Stop(context.Background())
		}
	}()
	if err != nil {
		return nil, err
	}

	if res.RedisUsedMBBefore, err = e.RedisUsedMB(ctx); err != nil {
		return nil, err
	}
	res.OutboxBytesBefore = outboxBytes(ctx, e)
	res.HoldSnapshot = opts.HoldSnapshot
	if opts.HoldSnapshot {
		release, err := holdSnapshot(ctx, e)
		if err != nil {
			return nil, err
		}
		defer release()
		fmt.Fprintln(progress, "lab: bench: holding a REPEATABLE READ snapshot (idle in transaction) until the run has drained")
	}
	if opts.Counts {
		if err := countsReset(ctx, e); err != nil {
			return nil, err
		}
	}
	cpu0, err := benchCPU(ctx, e)
	if err != nil {
		return nil, err
	}

	// pg_stat_activity sampler.
	waits := map[string]int{}
	sampCtx, stopSamp := context.WithCancel(ctx)
	sampDone := make(chan struct{})
	go func() {
		defer close(sampDone)
		res.PGWaitSamples = samplePGWaits(sampCtx, e, waits)
	}()
	stopSampler := func() { stopSamp(); <-sampDone }
	defer stopSampler()

	// Senders.
	recs := make([]sendRec, opts.Messages)
	var next, done, failed atomic.Int64
	sendCtx, cancelSend := context.WithTimeout(ctx, opts.SendTimeout)
	defer cancelSend()
	start := time.Now()
	sendersDone, err := startSenders(sendCtx, e, opts, recs, &next, &done, &failed)
	if err != nil {
		return nil, err
	}
	profDone := startProfile(ctx, e, opts, progress, got.n.Load)

	tick := time.NewTicker(opts.ProgressEvery)
	defer tick.Stop()
	parts := max(opts.Partitions, 1)
	report := func(phase string) {
		el := time.Since(start).Seconds()
		sh := got.n.Load()
		unsent, pending := backlog(ctx, e, parts)
		res.MaxUnsent, res.MaxPending = max(res.MaxUnsent, unsent), max(res.MaxPending, pending)
		fmt.Fprintf(progress, "lab: bench %s %5.1fs: sent %d/%d (errors %d)  shown %d  %.0f msg/s shown  backlog: outbox %d, queue %d\n",
			phase, el, done.Load(), opts.Messages, failed.Load(), sh, float64(sh)/max(el, 1e-9), unsent, pending)
	}
	waitSenders := true
	for waitSenders {
		select {
		case <-sendersDone:
			waitSenders = false
		case <-tick.C:
			report("sending")
		case <-ctx.Done():
			<-sendersDone
			return nil, ctx.Err()
		}
	}
	sendEnd := time.Now()
	okIDs := make([]string, 0, opts.Messages)
	for _, r := range recs {
		if r.ok {
			okIDs = append(okIDs, r.id)
		} else if r.errText != "" && res.FirstSendError == "" {
			res.FirstSendError = r.errText
		}
	}
	res.Sent = len(okIDs)
	res.SendErrors = int(failed.Load())

	// Drain: until every 201 is shown, or Drain.
	dctx, cancelDrain := context.WithTimeout(ctx, opts.Drain)
	for dctx.Err() == nil && got.n.Load() < int64(res.Sent) {
		select {
		case <-dctx.Done():
		case <-tick.C:
			report("draining")
		case <-time.After(5 * time.Millisecond):
		}
	}
	cancelDrain()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	end := time.Now()
	stopSampler()
	report("done")
	if err := <-profDone; err != nil {
		fmt.Fprintf(progress, "%v\n", err)
	}
	res.Wall = end.Sub(start)
	if opts.Counts {
		if res.Counts, err = countsRead(ctx, e); err != nil {
			return nil, err
		}
	}
	res.Tables = tableStats(ctx, e)
	if err := res.usage(ctx, e, cpu0); err != nil {
		return nil, err
	}

	// Figures.
	res.figures(recs, &got, start, sendEnd)
	for _, w := range watchers {
		res.DuplicatesShown += w.Duplicates()
	}

	if err := res.after(ctx, e, parts, waits); err != nil {
		return nil, err
	}
	return res, nil
}

// startSenders starts opts.Senders senders over opts.Transport, each in a
// closed loop taking the next message index until opts.Messages are taken
// or ctx ends, recording each send in recs; the returned channel is closed
// when all have stopped.
func startSenders(ctx context.Context, e *env.Env, opts BenchOptions, recs []sendRec, next, done, failed *atomic.Int64) (<-chan struct{}, error) {
	var wg sync.WaitGroup
	sendersDone := make(chan struct{})
	for k := range opts.Senders {
		var snd benchSender
		var err error
		if opts.Transport == TransportWS {
			snd, err = newWSSender(e.ConsumersURL, e.Token, int64(k%opts.Chats)+1, "b"+strconv.Itoa(k)+"-", 10*time.Second)
		} else {
			snd, err = probe.NewConnSender(e.ConsumersURL, e.Token, 10*time.Second)
		}
		if err != nil {
			go func() { wg.Wait(); close(sendersDone) }()
			return sendersDone, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer snd.Close()
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= int64(opts.Messages) {
					return
				}
				chatID := i%int64(opts.Chats) + 1
				t0 := time.Now()
				id, err := snd.Send(ctx, chatID, "bench "+strconv.FormatInt(i, 10))
				r := sendRec{id: id, t0: t0, t1: time.Now(), ok: err == nil}
				if err != nil {
					r.errText = err.Error()
					failed.Add(1)
				}
				recs[i] = r
				done.Add(1)
			}
		}()
	}
	go func() { wg.Wait(); close(sendersDone) }()
	return sendersDone, nil
}

// after reads the figures of the run's end: it waits (bounded) for the
// acknowledged stream entries to be trimmed, then reads Redis's memory
// and keys, the outbox tables' sizes, and the top Postgres waits.
func (res *BenchResult) after(ctx context.Context, e *env.Env, parts int, waits map[string]int) error {
	rdb := e.RedisClient()
	var err error
	// Redis after: wait (bounded) for the acknowledged entries to be
	// trimmed, then read used_memory.
	tctx, cancelTrim := context.WithTimeout(ctx, DefaultBenchTrimWait)
	streamLen := func(ctx context.Context) (total int64, err error) {
		for p := range parts {
			n, err := rdb.XLen(ctx, redisq.NewKeys(env.RedisPrefix, chat.PartitionQueue(chat.Consumers, p)).Stream).Result()
			if err != nil {
				return 0, err
			}
			total += n
		}
		return total, nil
	}
	_ = env.WaitFor(tctx, 100*time.Millisecond, func() bool {
		n, err := streamLen(tctx)
		return err == nil && n == 0
	})
	cancelTrim()
	res.StreamLenAfter, _ = streamLen(ctx)
	res.RedisKeysAfter, _ = rdb.DBSize(ctx).Result()
	if res.RedisUsedMBAfter, err = e.RedisUsedMB(ctx); err != nil {
		return err
	}
	res.OutboxBytesAfter = outboxBytes(ctx, e)

	for k, n := range waits {
		res.PGWaits = append(res.PGWaits, WaitCount{k, n})
	}
	sort.Slice(res.PGWaits, func(i, j int) bool {
		a, b := res.PGWaits[i], res.PGWaits[j]
		return a.Count > b.Count || (a.Count == b.Count && a.Key < b.Key)
	})
	if len(res.PGWaits) > 12 {
		res.PGWaits = res.PGWaits[:12]
	}
	return nil
}

// pgSettings are the extra Postgres settings of a bench: those of the
// counts when counting, else none.
func pgSettings(counts bool) []string {
	if counts {
		return countSettings
	}
	return nil
}

// holdSnapshot opens the held snapshot of BenchOptions.HoldSnapshot on a
// connection of its own and returns the function that ends it.
func holdSnapshot(ctx context.Context, e *env.Env) (release func(), err error) {
	conn, err := pgx.Connect(ctx, e.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("lab: bench: hold snapshot: connect: %w", err)
	}
	var n int64
	if _, err = conn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ"); err == nil {
		err = conn.QueryRow(ctx, "SELECT count(*) FROM consumers.outbox").Scan(&n)
	}
	if err != nil {
		_ = conn.Close(context.Background())
		return nil, fmt.Errorf("lab: bench: hold snapshot: %w", err)
	}
	return func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = conn.Exec(cctx, "ROLLBACK")
		_ = conn.Close(cctx)
	}, nil
}

// tableStats reads pg_stat_user_tables for the services' schemas, largest
// n_dead_tup first; nil if it cannot be read. A backend publishes its
// counts at most once a second, and one gone idle within a second of its
// last report waits 10 s (PostgreSQL 15's PGSTAT_MIN_INTERVAL and
// PGSTAT_IDLE_INTERVAL, src/backend/utils/activity/pgstat.c): read at the
// end of a short run, the counts miss up to the last 10 s of it.
func tableStats(ctx context.Context, e *env.Env) []TableStat {
	rows, err := e.Admin().Query(ctx, `SELECT schemaname || '.' || relname, n_dead_tup, n_live_tup,
		n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, autovacuum_count, pg_total_relation_size(relid)
		FROM pg_stat_user_tables WHERE schemaname IN ('consumers', 'workers')
		ORDER BY n_dead_tup DESC, 1`)
	if err != nil {
		return nil
	}
	ts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (TableStat, error) {
		var t TableStat
		err := r.Scan(&t.Table, &t.DeadTup, &t.LiveTup, &t.Ins, &t.Upd, &t.HotUpd, &t.Del, &t.Autovac, &t.SizeBytes)
		return t, err
	})
	if err != nil {
		return nil
	}
	return ts
}

// shownTimes returns the arrival times.
func (a *arrivals) shownTimes() []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	ts := make([]time.Time, 0, len(a.m))
	for _, s := range a.m {
		ts = append(ts, s.At)
	}
	return ts
}

// windowRates counts ts in successive windows of width w from start and
// returns each window's rate per second. The last window counts over its
// true length up to the last time, and is dropped when shorter than w/5.
func windowRates(start time.Time, ts []time.Time, w time.Duration) []float64 {
	var counts []int
	var last time.Time
	for _, t := range ts {
		if t.Before(start) {
			continue
		}
		i := int(t.Sub(start) / w)
		for len(counts) <= i {
			counts = append(counts, 0)
		}
		counts[i]++
		if t.After(last) {
			last = t
		}
	}
	rates := make([]float64, 0, len(counts))
	for i, n := range counts {
		width := w
		if i == len(counts)-1 {
			width = last.Sub(start) - time.Duration(i)*w
			if width < w/5 {
				break
			}
		}
		rates = append(rates, math.Round(float64(n)/width.Seconds()*10)/10)
	}
	return rates
}

// orDefault sets *v to d when *v is zero or negative.
func orDefault[T int | time.Duration](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}

// benchDefaults fills o's zero fields with their defaults.
func benchDefaults(o BenchOptions) BenchOptions {
	orDefault(&o.Senders, DefaultBenchSenders)
	orDefault(&o.Chats, DefaultBenchChats)
	orDefault(&o.Messages, DefaultBenchMessages)
	if o.Variant == "" {
		o.Variant = env.VariantV2
	}
	orDefault(&o.SendTimeout, DefaultBenchSendTimeout)
	orDefault(&o.Drain, DefaultBenchDrain)
	orDefault(&o.ProgressEvery, time.Second)
	orDefault(&o.ProfileSeconds, DefaultProfileSeconds)
	if o.Transport == "" {
		o.Transport = TransportHTTP
	}
	return o
}

// benchEnv starts the bench's lab environment (and, with RedisLatency,
// the links that delay Redis's replies); the func closes both.
func benchEnv(ctx context.Context, opts BenchOptions, progress io.Writer) (*env.Env, func(), error) {
	// The bench is one client IP and one user pushing thousands of
	// messages a second over a socket per chat: the per-IP and per-user
	// limits and the socket cap, meant for people, are off.
	args := env.UnlimitedArgs
	if opts.Retention > 0 {
		args = append(slices.Clip(args), "--history-retention", opts.Retention.String())
	}
	var links *env.Links
	closeLinks := func() {}
	if opts.RedisLatency > 0 {
		links = env.NewLinks()
		closeLinks = links.Close
	}
	e, err := env.Start(ctx, env.Options{Variant: opts.Variant, Progress: progress, ExtraArgs: args, Insecure: opts.Insecure, PgBouncer: opts.PgBouncer, Durable: opts.Durable,
		Partitions: opts.Partitions, Debug: opts.ProfileDir != "", PGSettings: pgSettings(opts.Counts), Links: links, Broker: opts.Broker})
	if err != nil {
		closeLinks()
		return nil, nil, err
	}
	closeAll := func() { _ = e.Close(); closeLinks() }
	if links != nil {
		for _, s := range []string{chat.Consumers, chat.Workers} {
			if _, err := links.Add(s+">redis", fault.NetLatency, "downstream", map[string]int{"latency": int(opts.RedisLatency.Milliseconds())}); err != nil {
				closeAll()
				return nil, nil, err
			}
		}
	}
	return e, closeAll, nil
}

// startProfile profiles the services (profileWindow) from
// DefaultProfileDelay on when opts.ProfileDir is set; the channel gets
// its outcome (nil at once without ProfileDir).
func startProfile(ctx context.Context, e *env.Env, opts BenchOptions, progress io.Writer, shown func() int64) <-chan error {
	done := make(chan error, 1)
	if opts.ProfileDir == "" {
		done <- nil
		return done
	}
	go func() {
		select {
		case <-time.After(DefaultProfileDelay):
		case <-ctx.Done():
			done <- ctx.Err()
			return
		}
		fmt.Fprintf(progress, "lab: bench: profiling every service process for %d s into %s\n", opts.ProfileSeconds, opts.ProfileDir)
		done <- profileWindow(ctx, e, opts.ProfileDir, opts.ProfileSeconds, shown)
	}()
	return done
}

// usage fills CPUS (each process's CPU seconds since cpu0, benchCPU's
// reading at the first send) and RSSMB (each service process's peak).
func (r *BenchResult) usage(ctx context.Context, e *env.Env, cpu0 map[string]float64) error {
	cpu1, err := benchCPU(ctx, e)
	if err != nil {
		return err
	}
	for k, v := range cpu1 {
		r.CPUS[k] = math.Round((v-cpu0[k])*100) / 100
	}
	for _, p := range e.Procs() {
		if u, err := p.Usage(); err == nil {
			r.RSSMB[p.Name()] = math.Round(float64(u.PeakRSSBytes)/(1<<20)*10) / 10
		}
	}
	return nil
}

// benchCPU is e.CPU's reading with the lab process's own CPU seconds
// (user + system, getrusage RUSAGE_SELF) as "lab".
func benchCPU(ctx context.Context, e *env.Env) (map[string]float64, error) {
	m, err := e.CPU(ctx)
	if err != nil {
		return nil, err
	}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		m["lab"] = time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
	}
	return m, nil
}

// backlog returns the number of unsent consumers' outbox rows (every
// partition's) and of consumers→workers queue entries not yet acknowledged
// (undelivered lag plus pending); -1 for a figure that could not be read.
func backlog(ctx context.Context, e *env.Env, partitions int) (unsent, queued int64) {
	ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if e.Admin().QueryRow(ctx, `SELECT count(*) FROM `+e.ConsumersOutbox()+` o WHERE sent_at IS NULL`).Scan(&unsent) != nil {
		unsent = -1
	}
	for p := range partitions {
		if e.Broker == env.BrokerNATS {
			n, err := e.NATSPending(ctx, chat.Consumers, chat.Workers, p)
			if err != nil {
				return unsent, -1
			}
			queued += n
			continue
		}
		stream := redisq.NewKeys(env.RedisPrefix, chat.PartitionQueue(chat.Consumers, p)).Stream
		groups, err := e.RedisClient().XInfoGroups(ctx, stream).Result()
		if err != nil {
			return unsent, -1
		}
		for _, g := range groups {
			if g.Name == chat.Workers {
				queued += g.Pending + max(g.Lag, 0)
			}
		}
	}
	return unsent, queued
}

// samplePGWaits samples pg_stat_activity every benchWaitSample until ctx
// ends, counting (role, state, wait event) of non-idle client backends in
// into, and returns the number of samples.
func samplePGWaits(ctx context.Context, e *env.Env, into map[string]int) int {
	const q = `SELECT coalesce(usename, ''), coalesce(state, ''), coalesce(wait_event_type, ''), coalesce(wait_event, '')
		FROM pg_stat_activity
		WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() AND state <> 'idle'`
	t := time.NewTicker(benchWaitSample)
	defer t.Stop()
	n := 0
	for {
		select {
		case <-ctx.Done():
			return n
		case <-t.C:
		}
		rows, err := e.Admin().Query(ctx, q)
		if err != nil {
			continue
		}
		for rows.Next() {
			var user, state, wt, we string
			if rows.Scan(&user, &state, &wt, &we) != nil {
				break
			}
			ev := wt + ":" + we
			if wt == "" {
				ev = "CPU (no wait event)"
			}
			into[fmt.Sprintf("%-10s %-20s %s", user, state, ev)]++
		}
		rows.Close()
		n++
	}
}

// WriteText prints the result for people.
func (r *BenchResult) WriteText(w io.Writer) {
	how, answered, call := "HTTP POST", "201", "HTTP send call"
	if r.Transport == TransportWS {
		how, answered, call = "WebSocket send frame", "acked", "send frame to its ack"
	}
	queue := "Redis Streams"
	if r.Broker == env.BrokerNATS {
		queue = "NATS JetStream"
	}
	fmt.Fprintf(w, "bench: %d senders, %d chats, %d messages (v2: %s to consumers → %s → WebSocket frame at workers)\nservers: %s\n\n",
		r.Senders, r.Chats, r.Messages, how, queue, env.ServerMode(r.Durable))
	fmt.Fprintf(w, "sent (%s): %d   send errors: %d   lost: %d   shown twice: %d\n", answered, r.Sent, r.SendErrors, r.Lost, r.DuplicatesShown)
	if r.FirstSendError != "" {
		fmt.Fprintf(w, "first send error: %s\n", r.FirstSendError)
	}
	fmt.Fprintf(w, "throughput: %.0f msg/s shown (%.1f s from the first send to the last shown); sends alone %.0f/s\n",
		r.ThroughputMsgsPerS, r.DurationS, r.SendRate)
	fmt.Fprintf(w, "latency send → shown: p50 %.1f ms  p95 %.1f ms  p99 %.1f ms   (%s alone: p50 %.1f ms)\n",
		r.P50Ms, r.P95Ms, r.P99Ms, call, r.SendP50Ms)
	fmt.Fprintf(w, "largest backlog seen: %d unsent outbox rows, %d queue entries not yet acknowledged\n", r.MaxUnsent, r.MaxPending)
	fmt.Fprintf(w, "p50 per leg: call → send tx %s ms, send tx → inbox tx %s ms, inbox tx → shown %s ms\n",
		probe.FmtMs(r.Stages.ToSendTx), probe.FmtMs(r.Stages.SendToInboxTx), probe.FmtMs(r.Stages.InboxTxToShown))
	fmt.Fprintf(w, "the slowest 1%% (≥ p99), median per leg: call → send tx %s ms, send tx → inbox tx %s ms, inbox tx → shown %s ms\n",
		probe.FmtMs(r.TailStages.ToSendTx), probe.FmtMs(r.TailStages.SendToInboxTx), probe.FmtMs(r.TailStages.InboxTxToShown))
	if len(r.SlowSeconds) > 0 {
		var parts []string
		for _, x := range r.SlowSeconds {
			parts = append(parts, fmt.Sprintf("%d s: p99 %.0f ms (%d msgs)", x.AtS, x.P99Ms, x.N))
		}
		fmt.Fprintf(w, "slowest seconds by send start: %s\n", strings.Join(parts, "; "))
	}
	fmt.Fprintln(w)
	names := make([]string, 0, len(r.CPUS))
	for k := range r.CPUS {
		names = append(names, k)
	}
	slices.Sort(names)
	rows := [][]string{{"process", "cpu s", "cpu % of 1 core", "peak rss MB"}}
	for _, k := range names {
		rss := "-"
		if v, ok := r.RSSMB[k]; ok {
			rss = fmt.Sprintf("%.1f", v)
		}
		share := "-"
		if r.Wall > 0 {
			share = fmt.Sprintf("%.0f%%", r.CPUS[k]/r.Wall.Seconds()*100)
		}
		rows = append(rows, []string{k, fmt.Sprintf("%.2f", r.CPUS[k]), share, rss})
	}
	probe.WriteColumns(w, rows)
	if len(r.WindowsMsgsPerS) > 0 {
		parts := make([]string, len(r.WindowsMsgsPerS))
		for i, v := range r.WindowsMsgsPerS {
			parts[i] = fmt.Sprintf("%.0f", v)
		}
		fmt.Fprintf(w, "\nshown per %s window (msg/s): %s\n", benchWindow, strings.Join(parts, ", "))
	}
	if r.HoldSnapshot {
		fmt.Fprintln(w, "a REPEATABLE READ snapshot was held through the run (--hold-snapshot)")
	}
	if len(r.Tables) > 0 {
		trows := [][]string{{"table", "n_dead_tup", "n_live_tup", "ins", "upd", "hot upd", "del", "autovacuums", "size MB"}}
		for _, t := range r.Tables {
			trows = append(trows, []string{t.Table, strconv.FormatInt(t.DeadTup, 10), strconv.FormatInt(t.LiveTup, 10),
				strconv.FormatInt(t.Ins, 10), strconv.FormatInt(t.Upd, 10), strconv.FormatInt(t.HotUpd, 10),
				strconv.FormatInt(t.Del, 10), strconv.FormatInt(t.Autovac, 10), fmt.Sprintf("%.1f", float64(t.SizeBytes)/(1<<20))})
		}
		fmt.Fprintln(w, "\npg_stat_user_tables at the end (Postgres publishes a backend's counts up to 10 s late: they may miss the run's last seconds)")
		probe.WriteColumns(w, trows)
	}
	fmt.Fprintf(w, "\nredis used_memory: %.2f MB before, %.2f MB after (stream entries left %d, keys %d)\n",
		r.RedisUsedMBBefore, r.RedisUsedMBAfter, r.StreamLenAfter, r.RedisKeysAfter)
	// The map holds both services' tables, every partition's.
	for _, t := range outboxTables(len(r.OutboxBytesBefore) / 2) {
		if b, ok := r.OutboxBytesBefore[t]; ok {
			fmt.Fprintf(w, "%s total size: %.2f MB before, %.2f MB after\n", t, float64(b)/(1<<20), float64(r.OutboxBytesAfter[t])/(1<<20))
		}
	}
	writeCounts(w, r.Counts, r.Sent-r.Lost)
	if len(r.PGWaits) > 0 {
		fmt.Fprintf(w, "\npostgres, non-idle client backends over %d samples (avg backends in that state):\n", r.PGWaitSamples)
		for _, wc := range r.PGWaits {
			fmt.Fprintf(w, "  %6.2f  %s\n", float64(wc.Count)/float64(max(r.PGWaitSamples, 1)), wc.Key)
		}
	}
}

// sendRec is one send of the bench: the message id (on 201), when the
// call started and returned, and its error.
type sendRec struct {
	id      string
	t0, t1  time.Time
	ok      bool
	errText string
}

// arrivals holds the first showing of each consumers' message over the
// bench's watchers (by message id), and how many there are. Safe for
// concurrent use.
type arrivals struct {
	mu sync.Mutex
	m  map[string]probe.Shown
	n  atomic.Int64
}

// record is a WatcherConfig.OnFrame.
func (a *arrivals) record(s probe.Shown) {
	if s.Message.From != chat.Consumers || s.Duplicate {
		return
	}
	a.mu.Lock()
	if _, ok := a.m[s.Message.ID]; !ok {
		a.m[s.Message.ID] = s
		a.n.Add(1)
	}
	a.mu.Unlock()
}

// startWatchers starts one watcher on e's workers per chat 1..chats,
// recording into got, and waits up to 20 s for them all to connect. It
// returns the watchers started (for the caller to stop) also on error.
func startWatchers(ctx context.Context, e *env.Env, chats int, got *arrivals) ([]*probe.Watcher, error) {
	watchers := make([]*probe.Watcher, 0, chats)
	for c := 1; c <= chats; c++ {
		w, err := probe.NewWatcher(e.WorkersURL, int64(c), &probe.WatcherConfig{Token: e.Token, OnFrame: got.record})
		if err != nil {
			return watchers, err
		}
		if err := w.Start(ctx); err != nil {
			return watchers, err
		}
		watchers = append(watchers, w)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for _, w := range watchers {
		if err := w.WaitConnected(wctx); err != nil {
			return watchers, fmt.Errorf("lab: bench: watchers could not connect to %s: %w", e.WorkersURL, err)
		}
	}
	return watchers, nil
}

// figures fills the latency, loss and rate figures of res from the sends
// and what the watchers were shown; start is the first send's start,
// sendEnd when the last sender returned.
func (res *BenchResult) figures(recs []sendRec, got *arrivals, start, sendEnd time.Time) {
	var lat, sendLat []time.Duration
	var lastShown time.Time
	var st probe.StageSamples
	type sample struct {
		d  time.Duration
		t0 time.Time
		sh probe.Shown
	}
	var all []sample
	got.mu.Lock()
	for _, r := range recs {
		if !r.ok {
			continue
		}
		sendLat = append(sendLat, r.t1.Sub(r.t0))
		sh, ok := got.m[r.id]
		if !ok {
			res.Lost++
			continue
		}
		at := sh.At
		st.Add(r.t0, sh)
		lat = append(lat, at.Sub(r.t0))
		all = append(all, sample{at.Sub(r.t0), r.t0, sh})
		if at.After(lastShown) {
			lastShown = at
		}
	}
	got.mu.Unlock()
	res.WindowsMsgsPerS = windowRates(start, got.shownTimes(), benchWindow)
	slices.Sort(lat)
	slices.Sort(sendLat)
	res.P50Ms, res.P95Ms, res.P99Ms = probe.RoundMs(probe.Percentile(lat, .5)), probe.RoundMs(probe.Percentile(lat, .95)), probe.RoundMs(probe.Percentile(lat, .99))
	res.SendP50Ms = probe.RoundMs(probe.Percentile(sendLat, .5))
	res.Stages = st.P50()
	p99 := probe.Percentile(lat, .99)
	var tail probe.StageSamples
	secs := map[int][]time.Duration{}
	for _, x := range all {
		if x.d >= p99 {
			tail.Add(x.t0, x.sh)
		}
		k := int(x.t0.Sub(start) / time.Second)
		secs[k] = append(secs[k], x.d)
	}
	res.TailStages = tail.P50()
	for k, ds := range secs {
		slices.Sort(ds)
		res.SlowSeconds = append(res.SlowSeconds, SlowSecond{AtS: k, P99Ms: probe.RoundMs(probe.Percentile(ds, .99)), N: len(ds)})
	}
	slices.SortFunc(res.SlowSeconds, func(a, b SlowSecond) int {
		if a.P99Ms != b.P99Ms {
			return cmp.Compare(b.P99Ms, a.P99Ms)
		}
		return cmp.Compare(a.AtS, b.AtS)
	})
	res.SlowSeconds = res.SlowSeconds[:min(5, len(res.SlowSeconds))]
	if !lastShown.IsZero() {
		d := lastShown.Sub(start)
		res.DurationS = math.Round(d.Seconds()*1000) / 1000
		res.ThroughputMsgsPerS = math.Round(float64(len(lat))/d.Seconds()*10) / 10
	}
	if d := sendEnd.Sub(start); d > 0 {
		res.SendRate = math.Round(float64(res.Sent)/d.Seconds()*10) / 10
	}
}
