package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/outboxchat/outboxchat/chat"
)

// prune deletes the delivered history older than --older-than, prints the
// counts by table (JSON or text), deletes nothing more when run again, and
// refuses a missing service or duration.
func TestPruneCommand(t *testing.T) {
	ctx := context.Background()
	dbURL, admin := testDatabase(t)
	db := []string{"--database-url", dbURL}
	for _, s := range []string{chat.Consumers, chat.Workers} {
		if _, err := runCmd(t, append([]string{"migrate", "--service", s}, db...)...); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := admin.Exec(ctx, `
		INSERT INTO consumers.messages (chat_id, seq, body, created_at)
			SELECT 1, g, 'b', now() - interval '2 days' FROM generate_series(1, 4) g;
		INSERT INTO consumers.receipts (chat_id, upto_seq, delivered_at) VALUES (1, 3, now() - interval '2 days')`); err != nil {
		t.Fatal(err)
	}
	out, err := runCmd(t, append([]string{"prune", "--service", "consumers", "--older-than", "24h", "--json"}, db...)...)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Deleted map[string]int64 `json:"deleted"`
		Total   int64            `json:"total"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got.Deleted["messages"] != 3 || got.Total != 3 {
		t.Fatalf("prune --json: %s; want 3 messages (the 4th has no receipt), nothing else", out)
	}
	out, err = runCmd(t, append([]string{"prune", "--service", "consumers", "--older-than", "24h"}, db...)...)
	if err != nil || !strings.Contains(out, ": 0 rows deleted") || !strings.Contains(out, "messages") {
		t.Fatalf("prune again: %v\n%s", err, out)
	}
	var next int64
	if err := admin.QueryRow(ctx, `SELECT seq FROM consumers.seq_floors WHERE chat_id = 1`).Scan(&next); err != nil || next != 3 {
		t.Fatalf("seq floor of chat 1: %d, %v; want 3", next, err)
	}
	for _, args := range [][]string{
		{"prune", "--older-than", "24h"},
		{"prune", "--service", "workers"},
	} {
		if _, err := runCmd(t, append(args, db...)...); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}
