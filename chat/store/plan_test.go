package store

import (
	"context"
	"strings"
	"testing"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
)

// TestFindKeysPlanLooksUpEachKey: the idempotency-key lookup, planned as
// pgx runs it after a few executions (a generic plan) on a table that was
// never analyzed (a new deployment, or the lab's), probes index
// messages_client_id once per key and never scans the messages table: a
// scan costs every send of a batch a read of the whole table.
func TestFindKeysPlanLooksUpEachKey(t *testing.T) {
	t.Parallel()
	h := chattest.New(t, "")
	ctx := context.Background()
	conn, err := h.Admin.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	q := newQueries(chat.Consumers)
	if _, err := conn.Exec(ctx, "PREPARE find_keys AS "+q.findKeys); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan"); err != nil {
		t.Fatal(err)
	}
	rows, err := conn.Query(ctx, `EXPLAIN (COSTS OFF) EXECUTE find_keys('{1,2,3}', '{a,b,c}')`)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for rows.Next() {
		var l string
		if err := rows.Scan(&l); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, l)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	plan := strings.Join(lines, "\n")
	if !strings.Contains(plan, "Index Scan using messages_client_id") || strings.Contains(plan, "Seq Scan on messages") || strings.Contains(plan, "Hash") {
		t.Fatalf("generic plan of findKeys does not look each key up in messages_client_id:\n%s", plan)
	}
}
