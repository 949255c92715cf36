package chattest

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// Statement is one SQL statement whose generic plan a test checks: Name
// (one word), SQL with $n parameters, and Args, the literal arguments an
// EXECUTE of it takes (e.g. `'{1,2}', 'workers'`).
type Statement struct{ Name, SQL, Args string }

// IndexedScans prepares each statement on the harness's admin connection
// with plan_cache_mode = force_generic_plan (the plan pgx's prepared
// statements get after five runs, made here while the tables may still be
// empty) and fails the test for every scan of one of tables that is not an
// index scan with an index condition (a seq or bitmap scan, or a whole
// index feeding a hash join). It returns, per statement, how many scans of
// those tables the plan has (Insert nodes not counted).
func (h *Harness) IndexedScans(t testing.TB, tables []string, sts ...Statement) map[string]int {
	t.Helper()
	ctx := context.Background()
	conn, err := h.Admin.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`); err != nil {
		t.Fatal(err)
	}
	scans := map[string]int{}
	for _, st := range sts {
		if _, err := conn.Exec(ctx, "PREPARE "+st.Name+" AS "+st.SQL); err != nil {
			t.Fatalf("%s: prepare: %v", st.Name, err)
		}
		rows, err := conn.Query(ctx, "EXPLAIN (COSTS OFF) EXECUTE "+st.Name+"("+st.Args+")")
		if err != nil {
			t.Fatalf("%s: explain: %v", st.Name, err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatalf("%s: explain: %v", st.Name, err)
		}
		plan := strings.Join(lines, "\n")
		for i, l := range lines {
			onTable := false
			for _, tbl := range tables {
				onTable = onTable || strings.Contains(l, " on "+tbl+" ") || strings.HasSuffix(l, " on "+tbl)
			}
			if !onTable || strings.Contains(l, "Insert on") {
				continue
			}
			scans[st.Name]++
			if !strings.Contains(l, "Index") || i+1 == len(lines) || !strings.Contains(lines[i+1], "Index Cond") {
				t.Errorf("%s: generic plan reads a table other than by an index condition (%q):\n%s", st.Name, strings.TrimSpace(l), plan)
			}
		}
	}
	return scans
}
