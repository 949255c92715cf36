package outbox_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/outbox"
)

func TestZZDebug(t *testing.T) {
	ctx := context.Background()
	pool := setup(t)
	w := newWriter(t, pool, outbox.WakeNone)
	pool.Exec(ctx, "LOAD 'auto_explain'")
	if _, err := pool.Exec(ctx, "ALTER DATABASE "+pool.Config().ConnConfig.Database+" SET session_preload_libraries = 'auto_explain'"); err != nil {
		t.Fatal(err)
	}
	pool.Exec(ctx, "ALTER DATABASE "+pool.Config().ConnConfig.Database+" SET auto_explain.log_min_duration = 5")
	pool.Exec(ctx, "ALTER DATABASE "+pool.Config().ConnConfig.Database+" SET auto_explain.log_analyze = on")
	pool.Exec(ctx, "ALTER DATABASE "+pool.Config().ConnConfig.Database+" SET auto_explain.log_buffers = on")
	pool.Reset()
	t.Cleanup(func() { b, _ := os.ReadFile(envServer.LogPath()); os.WriteFile("/tmp/pglog.txt", b, 0o644) })
	r := newRelay(t, pool, outbox.RelayConfig{Publisher: outbox.PublisherFunc(func(context.Context, []outbox.Message) error { return nil })})
	events := make([]outbox.Event, 100)
	id := 0
	for round := range 300 {
		for i := range events {
			id++
			events[i] = outbox.Event{ID: strconv.Itoa(id), Name: "m", Payload: []byte(`{"a":1}`)}
		}
		enqueue(t, pool, w, events...)
		t0 := time.Now()
		n, err := r.RunOnce(ctx)
		d := time.Since(t0)
		if round%30 == 0 || round > 297 {
			t.Logf("round %d: %d %v %v", round, n, err, d)
		}
	}
	for i := range events {
		id++
		events[i] = outbox.Event{ID: strconv.Itoa(id), Name: "m", Payload: []byte(`{"a":1}`)}
	}
	enqueue(t, pool, w, events...)
	conn, _ := pool.Acquire(ctx)
	defer conn.Release()
	for _, q := range []string{"SET plan_cache_mode = force_generic_plan",
		"PREPARE c(int) AS SELECT id, idempotency_key, event, payload, created_at FROM ob.outbox WHERE sent_at IS NULL ORDER BY id LIMIT $1 FOR UPDATE",
		"PREPARE u(bigint[]) AS UPDATE ob.outbox SET sent_at = now() WHERE id = ANY($1)", "BEGIN"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	for _, q := range []string{"EXPLAIN (ANALYZE, BUFFERS) EXECUTE c(100)", "EXPLAIN (ANALYZE, BUFFERS) EXECUTE u(ARRAY[1,2,3,30001]::bigint[])"} {
		rows, err := conn.Query(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var s string
			rows.Scan(&s)
			t.Log(s)
		}
	}
}
