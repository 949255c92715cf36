package gateway

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
)

// BenchmarkGatewayReadPlanCacheMode measures the gateway's read (one room,
// one page from a cursor; 100 chats of 200 messages and 200 received each)
// per op, in pgx's default query mode (named prepared statements, what
// plan_cache_mode acts on) and in exec mode (unnamed statements, what a
// transaction-mode pooler needs), with plan_cache_mode auto and
// force_generic_plan (what serve SETs on each connection, pooler.go).
func BenchmarkGatewayReadPlanCacheMode(b *testing.B) {
	h := chattest.New(b, "")
	ctx := context.Background()
	if _, err := h.Admin.Exec(ctx, `INSERT INTO workers.messages (chat_id, seq, body)
		SELECT c, s, 'sent ' || s FROM generate_series(1, 100) c, generate_series(1, 200) s`); err != nil {
		b.Fatal(err)
	}
	if _, err := h.Admin.Exec(ctx, `INSERT INTO workers.inbox (message_id, chat_id, seq, body, sender, sent_at)
		SELECT gen_random_uuid(), c, s, 'got ' || s, 'consumers', now() FROM generate_series(1, 100) c, generate_series(1, 200) s`); err != nil {
		b.Fatal(err)
	}
	if _, err := h.Admin.Exec(ctx, `ANALYZE workers.messages; ANALYZE workers.inbox`); err != nil {
		b.Fatal(err)
	}
	for _, mode := range []string{"cache_statement", "exec"} {
		for _, plan := range []string{"auto", "force_generic_plan"} {
			b.Run(mode+"/"+plan, func(b *testing.B) {
				cfg, err := pgxpool.ParseConfig(h.RoleURL(chat.Workers) + "&default_query_exec_mode=" + mode)
				if err != nil {
					b.Fatal(err)
				}
				cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
					_, err := c.Exec(ctx, "SET plan_cache_mode = "+plan)
					return err
				}
				pool, err := pgxpool.NewWithConfig(ctx, cfg)
				if err != nil {
					b.Fatal(err)
				}
				defer pool.Close()
				g, err := New(pool, chat.Workers, &Config{Channels: []string{chat.InboxChannel(chat.Workers)}})
				if err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					chatN, after := int64(1+i%100), int64(i%190)
					rows, err := pool.Query(ctx, g.query, []int64{chatN}, []int64{after}, []int64{after}, chat.Workers)
					if err != nil {
						b.Fatal(err)
					}
					n := 0
					for rows.Next() {
						n++
					}
					if err := rows.Err(); err != nil || n == 0 {
						b.Fatal(fmt.Sprint(n, err))
					}
				}
			})
		}
	}
}
