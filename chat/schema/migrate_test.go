package schema

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/internal/testenv"
)

// Migration 007 keeps what 006 knew: each message's delivered_at (now from
// receipts rows), and which inbox rows are behind a gap (now the held
// flag, from the rows themselves), so the receipts go on where they were.
func TestMigration007KeepsDeliveriesAndWatermarks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, err := pgxpool.New(ctx, testenv.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	for _, s := range []string{chat.Consumers, chat.Workers} {
		if err := Bootstrap(ctx, admin, s); err != nil {
			t.Fatal(err)
		}
		if _, err := MigrateUpTo(ctx, admin, s, 6); err != nil {
			t.Fatal(err)
		}
	}
	// Chat 1: seqs 1-3 delivered by one receipt, 4-5 by a later one, 6 not
	// yet. Workers' inbox: chat 1 has 1, 2, 4 (4 behind the gap at 3);
	// chat 2 has 2 only.
	_, err = admin.Exec(ctx, `
		INSERT INTO consumers.messages (chat_id, seq, body, delivered_at) VALUES
			(1, 1, 'a', '2026-11-30 10:00:01+00'), (1, 2, 'b', '2026-11-30 10:00:01+00'), (1, 3, 'c', '2026-11-30 10:00:01+00'),
			(1, 4, 'd', '2026-11-30 10:00:02+00'), (1, 5, 'e', '2026-11-30 10:00:02+00'), (1, 6, 'f', NULL);
		INSERT INTO workers.inbox (message_id, chat_id, seq, body, sender, sent_at) VALUES
			(gen_random_uuid(), 1, 1, 'a', 'consumers', now()), (gen_random_uuid(), 1, 2, 'b', 'consumers', now()),
			(gen_random_uuid(), 1, 4, 'd', 'consumers', now()), (gen_random_uuid(), 2, 2, 'x', 'consumers', now());
		INSERT INTO workers.inbox_watermarks (chat_id, upto) VALUES (1, 2)`)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{chat.Consumers, chat.Workers} {
		if n, err := MigrateUpTo(ctx, admin, s, 7); err != nil || n != 1 {
			t.Fatalf("migrate %s: %d, %v; want migration 007 applied", s, n, err)
		}
	}
	var got string
	if err := admin.QueryRow(ctx, `SELECT string_agg(seq || '@' || coalesce(to_char(delivered_at AT TIME ZONE 'UTC', 'SS'), '-'), ' ' ORDER BY seq)
		FROM consumers.messages_with_receipts WHERE chat_id = 1`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if want := "1@01 2@01 3@01 4@02 5@02 6@-"; got != want {
		t.Fatalf("delivered_at after the migration: %q, want %q", got, want)
	}
	if err := admin.QueryRow(ctx, `SELECT string_agg(chat_id || '/' || seq || ':' || held, ' ' ORDER BY chat_id, seq) FROM workers.inbox`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if want := "1/1:false 1/2:false 1/4:true 2/2:true"; got != want {
		t.Fatalf("inbox held after the migration: %q, want %q", got, want)
	}
}
