package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/outbox"
)

// Published rows are deleted; Vacuum gives their space back once the dead
// rows reach DeadRows: the table ends near its starting size.
func TestVacuumGivesSpaceBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w := setupWriter(t, outbox.WakeNone)
	size := func() int64 {
		var n int64
		if err := pool.QueryRow(ctx, "SELECT pg_relation_size('ob.outbox')").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	start := size()
	evs := make([]outbox.Event, 3000)
	for i := range evs {
		evs[i] = ev(fmt.Sprintf("v%d", i))
	}
	enqueue(t, pool, w, evs...)
	r := newRelay(t, pool, outbox.RelayConfig{Publisher: &recorder{}, BatchSize: 1000})
	for {
		n, err := r.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
	}
	grown := size()
	if grown < start+100_000 {
		t.Fatalf("heap %d → %d bytes; expected the 3,000 rows to take room", start, grown)
	}
	var vacuums int
	v, err := outbox.NewVacuum(pool, &outbox.VacuumConfig{Table: testTable, DeadRows: 2000,
		Vacuumed: func(before, after int64, _ time.Duration) { vacuums++ }})
	if err != nil {
		t.Fatal(err)
	}
	// The statistics reach pg_stat_user_tables within about a second.
	testenv.WaitFor(t, 30*time.Second, "a vacuum", func() bool {
		did, _, err := v.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return did
	})
	if got := size(); got > start+8192 {
		t.Fatalf("heap %d bytes after the vacuum; started at %d, grew to %d", got, start, grown)
	}
	if vacuums != 1 {
		t.Errorf("Vacuumed called %d times; want 1", vacuums)
	}
}
