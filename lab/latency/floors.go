package latency

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/lab/env"
	"github.com/outboxchat/outboxchat/lab/probe"
)

// floorWarmup is the number of unmeasured round trips before each floor.
const floorWarmup = 20

// Floors are the round trips that bound the end-to-end latency from below,
// measured on a lab environment's servers over loopback (p50 of Samples
// round trips each).
type Floors struct {
	// Commit is one INSERT committed in autocommit (one round trip, the
	// commit included) by the consumers role into a scratch table.
	Commit time.Duration
	// RedisPing is one PING on the lab's Redis.
	RedisPing time.Duration
	// NotifyWake is from the start of a NOTIFY (autocommit) on one
	// connection to its receipt on another connection that LISTENs.
	NotifyWake time.Duration
	// Samples is the number of round trips per floor.
	Samples int
	// Paced holds the same floors measured at the latency test's pace: each
	// round trip after Pace of idleness, as every message of the test is.
	// On a shared virtual machine an idle process is slow to wake (a TCP
	// echo to another process can take microseconds back to back and most
	// of a millisecond after 100 ms idle), so these, not the back-to-back
	// ones, are what bounds the test. Nil when not measured.
	Paced *PacedFloors
	// Fsync and SynchronousCommit are the Postgres settings the commit was
	// measured with ("on"/"off").
	Fsync, SynchronousCommit string
}

// PacedFloors are Floors measured one round trip per Pace of idleness: the
// p50 of Samples round trips of each kind, interleaved, each after Pace of
// sleep (so every process involved has been idle that long, as in the
// latency test).
type PacedFloors struct {
	// Commit, RedisPing and NotifyWake are measured as Floors' fields are.
	Commit, RedisPing, NotifyWake time.Duration
	// Pace is the idle time before each round trip; Samples the number of
	// round trips per floor.
	Pace    time.Duration
	Samples int
}

// Sum returns Commit + RedisPing + NotifyWake.
func (p *PacedFloors) Sum() time.Duration { return p.Commit + p.RedisPing + p.NotifyWake }

// Sum returns Commit + RedisPing + NotifyWake.
func (f *Floors) Sum() time.Duration { return f.Commit + f.RedisPing + f.NotifyWake }

// Write prints the floors and, when v2P50 > 0, the ratio of v2's p50 to
// their sum.
func (f *Floors) Write(w io.Writer, v2P50 time.Duration) {
	fmt.Fprintf(w, "floors (p50 on the lab's servers; postgres fsync=%s, synchronous_commit=%s):\n",
		f.Fsync, f.SynchronousCommit)
	rows := [][]string{
		{"", fmt.Sprintf("back to back (%d)", f.Samples)},
		{"  INSERT+COMMIT round trip", probe.FmtMs(f.Commit) + " ms"},
		{"  Redis PING", probe.FmtMs(f.RedisPing) + " ms"},
		{"  NOTIFY wake-up", probe.FmtMs(f.NotifyWake) + " ms"},
		{"  sum", probe.FmtMs(f.Sum()) + " ms"},
	}
	if p := f.Paced; p != nil {
		rows[0] = append(rows[0], fmt.Sprintf("one per %v idle (%d)", p.Pace, p.Samples))
		for i, d := range []time.Duration{p.Commit, p.RedisPing, p.NotifyWake, p.Sum()} {
			rows[i+1] = append(rows[i+1], probe.FmtMs(d)+" ms")
		}
	}
	probe.WriteColumns(w, rows)
	if v2P50 > 0 && f.Sum() > 0 {
		fmt.Fprintf(w, "v2 p50 / floors sum: %s ms / %s ms = %.1fx", probe.FmtMs(v2P50), probe.FmtMs(f.Sum()), float64(v2P50)/float64(f.Sum()))
		if p := f.Paced; p != nil && p.Sum() > 0 {
			fmt.Fprintf(w, " back to back; / %s ms = %.1fx at the test's pace", probe.FmtMs(p.Sum()), float64(v2P50)/float64(p.Sum()))
		}
		fmt.Fprintln(w)
	}
}

// MeasureFloors measures the floors on e's Postgres (as the consumers
// role; a scratch table consumers.lab_floor is created and dropped) and
// Redis, n round trips each after a short warm-up; then, when pace > 0,
// paced round trips each after pace of idleness (PacedFloorSamples of
// each, interleaved, about 3 × PacedFloorSamples × pace in all). It should
// run while the services are idle.
func MeasureFloors(ctx context.Context, e *env.Env, n int, pace time.Duration) (*Floors, error) {
	if n <= 0 {
		n = DefaultFloorSamples
	}
	f := &Floors{Samples: n}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second+3*PacedFloorSamples*pace)
	defer cancel()
	conn, err := pgx.Connect(ctx, e.ServiceDatabaseURL(chat.Consumers))
	if err != nil {
		return nil, fmt.Errorf("lab: floors: connect: %w", err)
	}
	defer conn.Close(context.Background())
	if err := conn.QueryRow(ctx, `SELECT current_setting('fsync'), current_setting('synchronous_commit')`).Scan(&f.Fsync, &f.SynchronousCommit); err != nil {
		return nil, fmt.Errorf("lab: floors: settings: %w", err)
	}

	// INSERT+COMMIT: a regular (WAL-logged) table; a temp table would skip
	// the WAL flush that a real commit pays.
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS consumers.lab_floor (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, fmt.Errorf("lab: floors: create scratch table: %w", err)
	}
	defer conn.Exec(context.Background(), `DROP TABLE IF EXISTS consumers.lab_floor`)
	commit := timed(func() error {
		_, err := conn.Exec(ctx, `INSERT INTO consumers.lab_floor DEFAULT VALUES`)
		return err
	})
	if f.Commit, err = p50Of(n, commit); err != nil {
		return nil, fmt.Errorf("lab: floors: insert: %w", err)
	}

	rdb := e.RedisClient()
	ping := timed(func() error { return rdb.Ping(ctx).Err() })
	if f.RedisPing, err = p50Of(n, ping); err != nil {
		return nil, fmt.Errorf("lab: floors: redis ping: %w", err)
	}

	notify, stop, err := notifyFloor(ctx, e, conn)
	if err != nil {
		return nil, err
	}
	defer stop()
	if f.NotifyWake, err = p50Of(n, notify); err != nil {
		return nil, fmt.Errorf("lab: floors: notify: %w", err)
	}
	if pace <= 0 {
		return f, nil
	}
	p := &PacedFloors{Pace: pace, Samples: PacedFloorSamples}
	var ds [3][]time.Duration
	for range PacedFloorSamples {
		for i, measure := range []func() (time.Duration, error){commit, ping, notify} {
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("lab: floors: %w", ctx.Err())
			case <-time.After(pace):
			}
			d, err := measure()
			if err != nil {
				return nil, fmt.Errorf("lab: floors: paced: %w", err)
			}
			ds[i] = append(ds[i], d)
		}
	}
	for i, d := range []*time.Duration{&p.Commit, &p.RedisPing, &p.NotifyWake} {
		slices.Sort(ds[i])
		*d = probe.Percentile(ds[i], 0.5)
	}
	f.Paced = p
	return f, nil
}

// notifyFloor returns a measurement of NOTIFY on conn → receipt on a
// second, listening connection (read by its own goroutine, which
// timestamps each receipt), and the function that closes it.
func notifyFloor(ctx context.Context, e *env.Env, conn *pgx.Conn) (measure func() (time.Duration, error), stop func(), err error) {
	lconn, err := pgx.Connect(ctx, e.ServiceDatabaseURL(chat.Consumers))
	if err != nil {
		return nil, nil, fmt.Errorf("lab: floors: connect listener: %w", err)
	}
	if _, err := lconn.Exec(ctx, `LISTEN lab_floor`); err != nil {
		lconn.Close(context.Background())
		return nil, nil, fmt.Errorf("lab: floors: listen: %w", err)
	}
	lctx, cancel := context.WithCancel(ctx)
	got := make(chan time.Time, 1)
	done := make(chan error, 1)
	go func() {
		for {
			if _, err := lconn.WaitForNotification(lctx); err != nil {
				done <- err
				return
			}
			select {
			case got <- time.Now():
			case <-lctx.Done():
				done <- lctx.Err()
				return
			}
		}
	}()
	stop = func() {
		cancel()
		<-done
		lconn.Close(context.Background())
	}
	measure = func() (time.Duration, error) {
		t0 := time.Now()
		if _, err := conn.Exec(ctx, `NOTIFY lab_floor`); err != nil {
			return 0, err
		}
		select {
		case at := <-got:
			return at.Sub(t0), nil
		case err := <-done:
			done <- err // for the deferred receive
			return 0, fmt.Errorf("listener: %w", err)
		case <-time.After(5 * time.Second):
			return 0, errors.New("notification not received within 5 s")
		}
	}
	return measure, stop, nil
}

// timed returns a measurement that times f.
func timed(f func() error) func() (time.Duration, error) {
	return func() (time.Duration, error) {
		t0 := time.Now()
		err := f()
		return time.Since(t0), err
	}
}

// p50Of runs measure floorWarmup times unmeasured, then n times, and
// returns the median of the n durations it reported.
func p50Of(n int, measure func() (time.Duration, error)) (time.Duration, error) {
	for range floorWarmup {
		if _, err := measure(); err != nil {
			return 0, err
		}
	}
	ds := make([]time.Duration, 0, n)
	for range n {
		d, err := measure()
		if err != nil {
			return 0, err
		}
		ds = append(ds, d)
	}
	slices.Sort(ds)
	return probe.Percentile(ds, 0.5), nil
}
