package inbox_test

import (
	"context"
	"testing"
	"time"
)

func TestTmpTiming(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for round := 0; round < 3; round++ {
		jobs := make([]any, 0)
		_ = jobs
		e.add(t, job("x"))
		start := time.Now()
		tx, _ := e.pool.Begin(ctx)
		for i := 0; i < 100; i++ {
			if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
				t.Fatal(err)
			}
		}
		t1 := time.Since(start)
		tx.Exec(ctx, `INSERT INTO t.inbox VALUES (gen_random_uuid(), 1, 1, 'x')`)
		tx.Commit(ctx)
		t2 := time.Since(start)
		src := e.source(t, "w")
		ds := fetchAll(t, src, 1)
		t3 := time.Now()
		src.Ack(ctx, ds[0].Ref)
		t.Logf("100 selects %v, commit %v, ack %v", t1, t2-t1, time.Since(t3))
	}
}
