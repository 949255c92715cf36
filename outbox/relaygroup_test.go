package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/outbox"
)

// groupTables creates n outbox tables, ob.outbox and ob.outbox_p1 …, and
// returns their names.
func groupTables(t *testing.T, pool *pgxpool.Pool, n int) []string {
	t.Helper()
	tables := []string{testTable}
	for i := 1; i < n; i++ {
		name := fmt.Sprintf("ob.outbox_p%d", i)
		if _, err := pool.Exec(context.Background(), outbox.TableDDL(name)); err != nil {
			t.Fatal(err)
		}
		tables = append(tables, name)
	}
	return tables
}

// groupSetup is setup with n outbox tables (groupTables) and a RelayGroup
// on the pool.
func groupSetup(t *testing.T, n int) (*pgxpool.Pool, []string, *outbox.RelayGroup) {
	t.Helper()
	pool := setup(t)
	tables := groupTables(t, pool, n)
	g, err := outbox.NewRelayGroup(pool)
	if err != nil {
		t.Fatal(err)
	}
	return pool, tables, g
}

// tableWriter is a WakeNone Writer of table.
func tableWriter(t *testing.T, pool *pgxpool.Pool, table string) *outbox.Writer {
	t.Helper()
	w, err := outbox.NewWriter(pool, &outbox.WriterConfig{Table: table, Mode: outbox.WakeNone})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// groupRelays makes a member Relay of g for each of tables, the i-th
// publishing to pubs[i] (with cfg applied to its config when set), and
// enqueues perTable events "t<i>-<j>" into each table.
func groupRelays(t *testing.T, pool *pgxpool.Pool, g *outbox.RelayGroup, tables []string, pubs []outbox.Publisher,
	perTable int, cfg func(*outbox.RelayConfig)) []*outbox.Relay {
	t.Helper()
	var relays []*outbox.Relay
	for i, table := range tables {
		c := outbox.RelayConfig{Table: table, Publisher: pubs[i], Group: g}
		if cfg != nil {
			cfg(&c)
		}
		relays = append(relays, newRelay(t, pool, c))
		w := tableWriter(t, pool, table)
		for j := range perTable {
			enqueue(t, pool, w, ev(fmt.Sprintf("t%d-%d", i, j)))
		}
	}
	return relays
}

func unsentIn(t *testing.T, pool *pgxpool.Pool, table string) []rowState {
	t.Helper()
	rs, err := pool.Query(context.Background(),
		"SELECT idempotency_key, sent_at IS NOT NULL, attempts, last_error FROM "+table+" ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rs, func(row pgx.CollectableRow) (rowState, error) {
		var s rowState
		return s, row.Scan(&s.id, &s.sent, &s.attempts, &s.lastError)
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

type passOutcome struct {
	n   int
	err error
}

func runOnceAsync(ctx context.Context, r *outbox.Relay) <-chan passOutcome {
	done := make(chan passOutcome, 1)
	go func() {
		n, err := r.RunOnce(ctx)
		done <- passOutcome{n, err}
	}()
	return done
}

func outcome(t *testing.T, name string, done <-chan passOutcome) passOutcome {
	t.Helper()
	select {
	case o := <-done:
		return o
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: no outcome after 30 s", name)
		return passOutcome{}
	}
}

// blocker is a Publisher that blocks its first call until released (and
// says when it entered), then records.
type blocker struct {
	recorder
	entered, release chan struct{}
	once             sync.Once
}

func newBlocker() *blocker {
	b := &blocker{entered: make(chan struct{}), release: make(chan struct{})}
	b.hook = func(ctx context.Context, call int, _ []outbox.Message) error {
		if call == 1 {
			b.once.Do(func() { close(b.entered) })
			select {
			case <-b.release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	return b
}

// sharedPass makes the passes of relays[1:] share one: relays[0]'s pass
// (its Publisher a blocker) is held in flight until the others, started
// one after the other in the order given, wait in the group; then it is
// released. It returns every relay's outcome.
func sharedPass(t *testing.T, g *outbox.RelayGroup, block *blocker, relays ...*outbox.Relay) []passOutcome {
	t.Helper()
	ctx := context.Background()
	dones := []<-chan passOutcome{runOnceAsync(ctx, relays[0])}
	select {
	case <-block.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the first relay's pass never published")
	}
	for i, r := range relays[1:] {
		// One at a time: they come into the group in the order given.
		dones = append(dones, runOnceAsync(ctx, r))
		testenv.WaitFor(t, 10*time.Second, "the pass waiting in the group", func() bool {
			return g.Waiting() == i+1
		})
	}
	close(block.release)
	out := make([]passOutcome, len(dones))
	for i, d := range dones {
		out[i] = outcome(t, fmt.Sprint("relay ", i), d)
	}
	return out
}

// Passes that start while a member's pass is in flight run together in the
// next one: each table's rows go to its own Publisher, in id order, and
// are deleted; the group idles again afterwards.
func TestRelayGroupSharesThePassesThatWait(t *testing.T) {
	t.Parallel()
	pool, tables, g := groupSetup(t, 3)
	block := newBlocker()
	pubs := []outbox.Publisher{block, &recorder{}, &recorder{}}
	var mu sync.Mutex
	var claims []string // the order of the members' claims
	relays := groupRelays(t, pool, g, tables, pubs, 3, func(c *outbox.RelayConfig) {
		c.OnEvent = func(e outbox.RelayEvent) {
			if e.Kind == outbox.EventClaimed {
				mu.Lock()
				claims = append(claims, c.Table)
				mu.Unlock()
			}
		}
	})
	// The third relay's pass comes in before the second's, which joined
	// the group first.
	out := sharedPass(t, g, block, relays[0], relays[2], relays[1])
	out[1], out[2] = out[2], out[1]
	for i, o := range out {
		if o.err != nil || o.n != 3 {
			t.Fatalf("relay %d's pass = %d, %v; want 3 rows", i, o.n, o.err)
		}
	}
	mu.Lock()
	if !slices.Equal(claims, tables) {
		t.Fatalf("claims in the order %v, want %v (the order the relays joined the group)", claims, tables)
	}
	mu.Unlock()
	if got, want := g.Stats(), (outbox.RelayGroupStats{Transactions: 2, Passes: 3}); got != want {
		t.Fatalf("group stats = %+v, want %+v", got, want)
	}
	for i, p := range pubs {
		rec := &block.recorder
		if i > 0 {
			rec = p.(*recorder)
		}
		if got, want := rec.ids(), []string{fmt.Sprintf("t%d-0", i), fmt.Sprintf("t%d-1", i), fmt.Sprintf("t%d-2", i)}; !slices.Equal(got, want) {
			t.Fatalf("table %d published %v, want %v", i, got, want)
		}
		if left := unsentIn(t, pool, tables[i]); len(left) != 0 {
			t.Fatalf("table %d rows left: %+v", i, left)
		}
	}
	// Idle again: a pass runs at once, alone.
	if n, err := relays[1].RunOnce(context.Background()); err != nil || n != 0 {
		t.Fatalf("RunOnce after the shared pass = %d, %v", n, err)
	}
	if got := g.Stats().Transactions; got != 3 {
		t.Fatalf("transactions = %d, want 3", got)
	}
}

// In a shared pass a Publisher that fails fails its member's pass alone:
// its rows stay unsent with one more attempt and its error, while the
// other members' rows are published and deleted; a row a Publisher blames
// gets a failure of its own and holds back the rows behind it, as in a
// pass of its own.
func TestRelayGroupFailuresStayWithTheirMember(t *testing.T) {
	t.Parallel()
	pool, tables, g := groupSetup(t, 4)
	block := newBlocker()
	down := errors.New("broker down")
	failing := outbox.PublisherFunc(func(context.Context, []outbox.Message) error { return down })
	blaming := outbox.PublisherFunc(func(_ context.Context, msgs []outbox.Message) error {
		return &outbox.MessageError{RowID: msgs[1].RowID, Err: errors.New("too large")}
	})
	fine := &recorder{}
	pubs := []outbox.Publisher{block, failing, blaming, fine}
	relays := groupRelays(t, pool, g, tables, pubs, 3, nil)
	out := sharedPass(t, g, block, relays...)
	if o := out[1]; !errors.Is(o.err, down) {
		t.Fatalf("the failing member's pass = %d, %v; want its Publisher's error", o.n, o.err)
	}
	if o := out[2]; o.err != nil || o.n != 1 {
		t.Fatalf("the blaming member's pass = %d, %v; want 1 row published", o.n, o.err)
	}
	if o := out[3]; o.err != nil || o.n != 3 {
		t.Fatalf("the fine member's pass = %d, %v; want 3 rows", o.n, o.err)
	}
	left := unsentIn(t, pool, tables[1])
	if len(left) != 3 {
		t.Fatalf("failing member's rows = %+v, want all 3 unsent", left)
	}
	for _, r := range left {
		if r.attempts != 1 || r.lastError == nil || !strings.HasSuffix(*r.lastError, "broker down") {
			t.Fatalf("failing member's row %+v: want attempts 1 and last_error naming the broker", r)
		}
	}
	if left := unsentIn(t, pool, tables[2]); len(left) != 2 || left[0].id != "t2-1" {
		t.Fatalf("blaming member's rows = %+v, want t2-1 and t2-2 unsent", left)
	}
	var failures int
	if err := pool.QueryRow(context.Background(), "SELECT failures FROM "+tables[2]+" WHERE idempotency_key = 't2-1'").Scan(&failures); err != nil || failures != 1 {
		t.Fatalf("failures of the blamed row = %d, %v; want 1", failures, err)
	}
	if left := unsentIn(t, pool, tables[3]); len(left) != 0 {
		t.Fatalf("fine member's rows left: %+v", left)
	}
	if got := fine.ids(); !slices.Equal(got, []string{"t3-0", "t3-1", "t3-2"}) {
		t.Fatalf("fine member published %v", got)
	}
}

// Two processes, each relaying three tables in a group of its own, under
// concurrent writers whose transactions commit out of id order: every
// event is published, each chat's events first in their order, and no row
// is left — the claim floors hold across shared passes.
func TestRelayGroupOrderUnderConcurrentWriters(t *testing.T) {
	t.Parallel()
	const writers, perWriter, chats = 12, 40, 6
	pool := setup(t)
	tables := groupTables(t, pool, 3)
	wpool := newPool(t, pool, 8)
	ws := make([]*outbox.Writer, len(tables))
	for i, table := range tables {
		ws[i] = tableWriter(t, wpool, table)
	}
	rec := &recorder{}
	var groups []*outbox.RelayGroup
	for proc := range 2 {
		ppool := newPool(t, pool, 4)
		g, err := outbox.NewRelayGroup(ppool)
		if err != nil {
			t.Fatal(err)
		}
		groups = append(groups, g)
		for i, table := range tables {
			// Small batches make the passes interleave often; a short
			// poll stands in for the wake-ups.
			r := newRelay(t, ppool, outbox.RelayConfig{Table: table, Publisher: rec, Group: g,
				BatchSize: 5 + i + proc, PollInterval: 5 * time.Millisecond, DisableListen: true})
			startRelay(t, r)
		}
	}
	writeChats(t, wpool, writers, perWriter, chats, func(chat int) *outbox.Writer { return ws[chat%len(ws)] })
	checkChatOrder(t, rec, writers*perWriter, chats)
	for _, table := range tables {
		if left := unsentIn(t, pool, table); len(left) != 0 {
			t.Fatalf("%s: %d rows left", table, len(left))
		}
	}
	var shared int64
	for _, g := range groups {
		s := g.Stats()
		shared += s.Passes - s.Transactions
	}
	if shared == 0 {
		t.Fatal("no pass was shared: the test did not exercise shared passes")
	}
	t.Logf("%d publications for %d ids; passes that rode on another's transaction: %d", len(rec.ids()), writers*perWriter, shared)
}

// A RelayGroup made with another pool is refused.
func TestRelayGroupOnAnotherPoolIsRefused(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	g, err := outbox.NewRelayGroup(newPool(t, pool, 1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.NewRelay(pool, &outbox.RelayConfig{Table: testTable, Publisher: &recorder{}, Group: g}); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Fatalf("NewRelay with a group of another pool = %v, want ErrInvalidConfig", err)
	}
	if _, err := outbox.NewRelayGroup(nil); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Fatalf("NewRelayGroup(nil) = %v, want ErrInvalidConfig", err)
	}
}

// The connection of a shared pass dies after its members published (the
// database restarted, say): every member's pass fails, their rows stay
// unsent with one more attempt, and the next passes publish them again
// (at least once) and delete them.
func TestRelayGroupConnectionLostMidPass(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, tables, g := groupSetup(t, 3)
	block := newBlocker()
	killer := &recorder{}
	killer.hook = func(ctx context.Context, call int, _ []outbox.Message) error {
		if call == 1 {
			// The shared pass's backend is the one idle in its transaction
			// (holding the claims' locks) while the members publish.
			_, err := pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
				WHERE datname = current_database() AND state = 'idle in transaction' AND pid <> pg_backend_pid()`)
			return err
		}
		return nil
	}
	other := &recorder{}
	pubs := []outbox.Publisher{block, killer, other}
	relays := groupRelays(t, pool, g, tables, pubs, 2, nil)
	out := sharedPass(t, g, block, relays...)
	if out[0].err != nil || out[0].n != 2 {
		t.Fatalf("the first pass = %d, %v; want 2 rows", out[0].n, out[0].err)
	}
	for i := 1; i < 3; i++ {
		if out[i].err == nil {
			t.Fatalf("relay %d's pass on the lost connection = %d, nil; want an error", i, out[i].n)
		}
		left := unsentIn(t, pool, tables[i])
		if len(left) != 2 || left[0].attempts != 1 || left[1].attempts != 1 {
			t.Fatalf("relay %d's rows after the lost pass = %+v, want both unsent with one attempt", i, left)
		}
	}
	for i := 1; i < 3; i++ {
		if n, err := relays[i].RunOnce(ctx); err != nil || n != 2 {
			t.Fatalf("relay %d's next pass = %d, %v; want its 2 rows", i, n, err)
		}
		if left := unsentIn(t, pool, tables[i]); len(left) != 0 {
			t.Fatalf("relay %d's rows left: %+v", i, left)
		}
	}
	for i, rec := range []*recorder{killer, other} {
		if got, want := rec.distinct(), []string{fmt.Sprintf("t%d-0", i+1), fmt.Sprintf("t%d-1", i+1)}; !slices.Equal(got, want) {
			t.Fatalf("relay %d published %v, want %v at least once, in order", i+1, got, want)
		}
	}
}
