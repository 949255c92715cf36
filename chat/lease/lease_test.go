package lease

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/chat/schema"
	"github.com/outboxchat/outboxchat/internal/testenv"
)

func TestShare(t *testing.T) {
	for _, c := range []struct{ n, live, rank, want int }{
		{4, 1, 0, 4}, {4, 2, 0, 2}, {4, 2, 1, 2}, {4, 3, 0, 2}, {4, 3, 1, 1}, {4, 3, 2, 1},
		{4, 5, 3, 1}, {4, 5, 4, 0}, {1, 2, 0, 1}, {1, 2, 1, 0}, {7, 0, 0, 7},
	} {
		if got := share(c.n, c.live, c.rank); got != c.want {
			t.Errorf("share(%d, %d, %d) = %d, want %d", c.n, c.live, c.rank, got, c.want)
		}
	}
	// The shares of all members always add up to n.
	for n := 1; n <= 9; n++ {
		for live := 1; live <= 11; live++ {
			sum := 0
			for r := range live {
				sum += share(n, live, r)
			}
			if sum != n {
				t.Fatalf("n=%d live=%d: shares add up to %d", n, live, sum)
			}
		}
	}
}

// work records which partitions run where: Acquired and Released of each
// manager.
type work struct {
	mu      sync.Mutex
	running map[string][]int
}

func (w *work) config(h *chattest.Harness, owner string, n int, ttl time.Duration) *Config {
	return &Config{Service: chat.Consumers, Owner: owner, Partitions: n, TTL: ttl,
		Acquired: func(_ context.Context, p int) {
			w.mu.Lock()
			defer w.mu.Unlock()
			w.running[owner] = append(w.running[owner], p)
		},
		Released: func(_ context.Context, p int) {
			w.mu.Lock()
			defer w.mu.Unlock()
			w.running[owner] = slices.DeleteFunc(w.running[owner], func(q int) bool { return q == p })
		},
	}
}

// counts returns how many partitions run per owner, and whether any
// partition runs twice.
func (w *work) counts() (map[string]int, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]int{}
	seen := map[int]bool{}
	dup := false
	for o, ps := range w.running {
		out[o] = len(ps)
		for _, p := range ps {
			dup = dup || seen[p]
			seen[p] = true
		}
	}
	return out, dup
}

func setup(t *testing.T, n int) *chattest.Harness {
	t.Helper()
	h := chattest.New(t, "")
	if err := schema.EnsurePartitions(context.Background(), h.Admin, chat.Consumers, n); err != nil {
		t.Fatal(err)
	}
	return h
}

// Three managers on 7 partitions, driven round by round (RunOnce): they
// settle on shares 3, 2, 2 with no partition run twice; when one leaves
// (graceful stop), the other two take 4 and 3.
func TestManagersShareAndRebalance(t *testing.T) {
	t.Parallel()
	const n = 7
	h := setup(t, n)
	w := &work{running: map[string][]int{}}
	ctx := context.Background()
	var ms []*Manager
	for _, o := range []string{"a", "b", "c"} {
		m, err := New(h.Admin, w.config(h, o, n, time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	rounds := func(k int, live []*Manager) {
		t.Helper()
		for range k {
			for _, m := range live {
				if err := m.RunOnce(ctx); err != nil {
					t.Fatal(err)
				}
				if _, dup := w.counts(); dup {
					t.Fatalf("a partition runs twice: %v", w.running)
				}
			}
		}
	}
	rounds(3, ms)
	got, _ := w.counts()
	if fmt.Sprint(got) != "map[a:3 b:2 c:2]" {
		t.Fatalf("after three rounds: %v, want a:3 b:2 c:2", got)
	}
	// c leaves gracefully: its leases and member row go at once.
	if err := ms[2].Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ms[2].Stop(ctx); err != nil {
		t.Fatal(err)
	}
	rounds(2, ms[:2])
	got, _ = w.counts()
	if fmt.Sprint(got) != "map[a:4 b:3 c:0]" {
		t.Fatalf("after c left: %v, want a:4 b:3 c:0", got)
	}
}

// A manager whose lease another owner took (its own had expired) stops
// that partition's work at its next round; one killed (Start's ctx
// cancelled) releases nothing, and another takes its partitions once the
// TTL has passed.
func TestManagerLostAndExpiredLeases(t *testing.T) {
	t.Parallel()
	const n = 2
	// a's leases last long enough for b's first round to run well before
	// they expire; b's own are short.
	const ttlA, ttl = 3 * time.Second, 600 * time.Millisecond
	h := setup(t, n)
	w := &work{running: map[string][]int{}}
	ctx := context.Background()
	a, err := New(h.Admin, w.config(h, "a", n, ttlA))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got := a.Held(); !slices.Equal(got, []int{0, 1}) {
		t.Fatalf("a holds %v, want [0 1]", got)
	}
	// Another owner took partition 1 (as after a's lease had expired).
	if _, err := h.Admin.Exec(ctx, `UPDATE consumers.partition_leases SET owner = 'x', expires_at = now() + interval '1 hour'
		WHERE partition = 1`); err != nil {
		t.Fatal(err)
	}
	if err := a.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got := a.Held(); !slices.Equal(got, []int{0}) {
		t.Fatalf("a holds %v after losing partition 1, want [0]", got)
	}
	if got, _ := w.counts(); got["a"] != 1 {
		t.Fatalf("a runs %d partitions, want 1", got["a"])
	}
	if _, err := h.Admin.Exec(ctx, `UPDATE consumers.partition_leases SET owner = NULL, expires_at = '-infinity'
		WHERE partition = 1`); err != nil {
		t.Fatal(err)
	}

	// a runs on its own loop, then is killed: nothing released.
	actx, kill := context.WithCancel(ctx)
	if err := a.Start(actx); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "a holds both partitions", func() bool { return len(a.Held()) == n })
	kill()
	<-a.life.Stopped()
	b, err := New(h.Admin, w.config(h, "b", n, ttl))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got := b.Held(); len(got) != 0 {
		t.Fatalf("b took %v while a's leases were live", got)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop(context.Background()) })
	testenv.WaitFor(t, ttlA+time.Second, "b takes a's expired partitions", func() bool { return len(b.Held()) == n })
}
