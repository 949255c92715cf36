package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/chat/store"
	"github.com/outboxchat/outboxchat/internal/testenv"
)

// The retention service prunes a chat's delivered history on both sides
// while a WebSocket client stays open at its last seq: the chat's rows go
// (counted by table), and the next messages get the next seqs, reach the
// client and are receipted.
func TestRetentionPrunesAndChatsKeepFlowing(t *testing.T) {
	t.Parallel()
	h, cons, work := startBoth(t)
	ctx := context.Background()
	const chatID = 31
	f := newFlow(t, h, cons, work, chatID, 3)
	receipts := h.Count(t, `SELECT count(*) FROM consumers.receipts WHERE chat_id = $1`, chatID)
	// Two days old, as the history a retention of one day prunes.
	if _, err := h.Admin.Exec(ctx, `
		UPDATE consumers.messages SET created_at = created_at - interval '2 days';
		UPDATE consumers.receipts SET delivered_at = delivered_at - interval '2 days';
		UPDATE workers.inbox SET received_at = received_at - interval '2 days'`); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	metric := map[string]int64{}
	for _, svc := range []string{chat.Consumers, chat.Workers} {
		r := newRetention(h.Admin, svc, 24*time.Hour, func(table string, n int64) { metric[svc+"."+table] += n }, log)
		n, err := r.runOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for table, k := range n {
			if metric[svc+"."+table] != k {
				t.Fatalf("%s.%s: %d deleted, %d counted by the metric hook", svc, table, k, metric[svc+"."+table])
			}
		}
	}
	if metric["consumers.messages"] != 3 || metric["consumers.receipts"] != int64(receipts-1) || metric["workers.inbox"] != 3 {
		t.Fatalf("deleted %v; want consumers' 3 messages and %d receipts (all but the newest), workers' 3 inbox rows", metric, receipts-1)
	}
	f.send(4, 5)
}

// Prune never deletes what is still needed: a message no receipt covers
// (the re-drive still publishes it), a chat's newest receipt, an inbox row
// held behind a gap, a chat's newest gap fill and floor, or anything
// younger than the cutoff; it deletes in batches of the size asked.
func TestPruneKeepsWhatSeqAndReceiptsNeed(t *testing.T) {
	t.Parallel()
	h := chattest.New(t, "")
	ctx := context.Background()
	if _, err := h.Admin.Exec(ctx, `
		INSERT INTO consumers.messages (chat_id, seq, body, created_at)
			SELECT 1, g, 'b', now() - interval '3 days' FROM generate_series(1, 5) g;
		INSERT INTO consumers.messages (chat_id, seq, body) VALUES (1, 6, 'young');
		INSERT INTO consumers.receipts (chat_id, upto_seq, delivered_at) VALUES
			(1, 2, now() - interval '3 days'), (1, 4, now() - interval '3 days');
		INSERT INTO workers.inbox (message_id, chat_id, seq, body, sender, sent_at, received_at, held)
			SELECT gen_random_uuid(), 1, g, 'b', 'consumers', now(), now() - interval '3 days', g > 3
			FROM generate_series(1, 3) g UNION ALL
			SELECT gen_random_uuid(), 1, 5, 'b', 'consumers', now(), now() - interval '3 days', true;
		INSERT INTO workers.inbox_gap_fills (chat_id, upto) VALUES (1, 1), (1, 2);
		INSERT INTO workers.inbox_duplicates (message_id, seen_at) VALUES
			(gen_random_uuid(), now() - interval '3 days'), (gen_random_uuid(), now())`); err != nil {
		t.Fatal(err)
	}
	prune := func(svc string) store.PruneCounts {
		t.Helper()
		n, err := store.Prune(ctx, h.Admin, store.PruneConfig{Service: svc, OlderThan: 24 * time.Hour, Batch: 2})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	got := fmt.Sprint(prune(chat.Consumers), prune(chat.Workers))
	want := fmt.Sprint(
		store.PruneCounts{"messages": 4, "receipts": 1, "inbox": 0, "inbox_gap_fills": 0, "inbox_duplicates": 0, "seq_floors": 1},
		store.PruneCounts{"messages": 0, "receipts": 0, "inbox": 3, "inbox_gap_fills": 2, "inbox_duplicates": 1, "seq_floors": 0})
	if got != want {
		t.Fatalf("pruned %s, want %s", got, want)
	}
	for _, c := range []struct{ sql, want string }{
		{`SELECT string_agg(seq::text, ' ' ORDER BY seq) FROM consumers.messages`, "5 6"},
		{`SELECT string_agg(upto_seq::text, ' ') FROM consumers.receipts`, "4"},
		{`SELECT string_agg(seq::text, ' ') FROM consumers.seq_floors`, "4"},
		{`SELECT string_agg(seq || ':' || held, ' ') FROM workers.inbox`, "5:true"},
		{`SELECT string_agg(upto::text, ' ') FROM workers.inbox_gap_fills`, "3"},
		{`SELECT count(*)::text FROM workers.inbox_duplicates`, "1"},
	} {
		var s string
		if err := h.Admin.QueryRow(ctx, c.sql).Scan(&s); err != nil {
			t.Fatal(err)
		}
		if s != c.want {
			t.Errorf("%s: %q, want %q", c.sql, s, c.want)
		}
	}
}

// serve --history-retention: the relay role prunes at start and counts the
// rows by table in outboxchat_history_pruned_rows_total.
func TestServeRunsRetention(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	if _, err := h.Admin.Exec(context.Background(), `
		INSERT INTO consumers.messages (chat_id, seq, body, created_at)
			SELECT 1, g, 'b', now() - interval '3 days' FROM generate_series(1, 3) g;
		INSERT INTO consumers.receipts (chat_id, upto_seq, delivered_at) VALUES (1, 3, now() - interval '3 days')`); err != nil {
		t.Fatal(err)
	}
	cons := h.start(chat.Consumers, func(c *Config) { c.Relay.HistoryRetention = 24 * time.Hour })
	testenv.WaitFor(t, 20*time.Second, "3 messages pruned and counted", func() bool {
		m, err := chattest.Get(cons.base + "/metrics")
		return err == nil && strings.Contains(m, `outboxchat_history_pruned_rows_total{table="messages"} 3`) &&
			strings.Contains(m, `outboxchat_history_pruned_rows_total{table="receipts"} 0`)
	})
	if n := h.Count(t, `SELECT count(*) FROM consumers.messages`); n != 0 {
		t.Fatalf("%d messages left, want 0", n)
	}
}
