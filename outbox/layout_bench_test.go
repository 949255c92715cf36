package outbox_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/outbox"
)

// BenchmarkPartitionLayout compares, in plain SQL, the two layouts a
// partitioned outbox can have (16 partitions): "tables", one outbox table
// per partition (TableDDL, what chat's --partitions uses), and "column",
// one table with a partition column and a partial index on (partition, id)
// of the unsent rows. Per op: 8 send transactions of 8 events each, every
// event in a random partition (tables: one multi-row INSERT per partition
// the transaction touches; column: one INSERT), then one relay pass over
// all 16 partitions in one transaction, as a RelayGroup runs it (a claim
// per partition from its own claim floor, FOR UPDATE in id order, then a
// DELETE per partition that had rows). It reports the wall time per event of the sends and of the
// pass, on the test's private Postgres (its work included).
func BenchmarkPartitionLayout(b *testing.B) {
	const parts, txs, perTx, batch = 16, 8, 8, 500
	payload := `{"chat_id":1,"seq":1,"body":"hello"}`
	type layout struct {
		ddl   string
		send  func(bt *pgx.Batch, ev []int) // ev: each event's partition
		claim func(bt *pgx.Batch, p int, floor int64)
		del   func(bt *pgx.Batch, p int, ids []int64)
	}
	key := 0
	keys := func(n int) (es, ks, ps []string) {
		for range n {
			key++
			es, ks, ps = append(es, "message.created"), append(ks, strconv.Itoa(key)), append(ps, payload)
		}
		return es, ks, ps
	}
	claimCols := "SELECT id FROM %s WHERE sent_at IS NULL AND parked_at IS NULL AND id >= $2"
	tableName := func(p int) string { return "ob.lt_p" + strconv.Itoa(p) }
	layouts := map[string]layout{
		"tables": {
			ddl: func() string {
				s := ""
				for p := range parts {
					s += outbox.TableDDL(tableName(p))
				}
				return s
			}(),
			send: func(bt *pgx.Batch, ev []int) {
				byPart := map[int]int{}
				for _, p := range ev {
					byPart[p]++
				}
				for p, n := range byPart {
					es, ks, ps := keys(n)
					bt.Queue(`INSERT INTO `+tableName(p)+` (event, idempotency_key, payload)
						SELECT e, k, p::jsonb FROM unnest($1::text[], $2::text[], $3::text[]) AS u(e, k, p)`, es, ks, ps)
				}
			},
			claim: func(bt *pgx.Batch, p int, floor int64) {
				bt.Queue(fmt.Sprintf(claimCols, tableName(p))+" ORDER BY id LIMIT $1 FOR UPDATE", batch, floor)
			},
			del: func(bt *pgx.Batch, p int, ids []int64) {
				bt.Queue(`DELETE FROM `+tableName(p)+` WHERE id = ANY($1)`, ids)
			},
		},
		"column": {
			// The outbox table with a partition column, and its unsent
			// index keyed by partition first.
			ddl: outbox.TableDDL("ob.lc") + `ALTER TABLE ob.lc ADD COLUMN part smallint NOT NULL;
DROP INDEX ob.ob_lc_unsent;
CREATE INDEX lc_unsent ON ob.lc (part, id) WHERE sent_at IS NULL;`,
			send: func(bt *pgx.Batch, ev []int) {
				es, ks, ps := keys(len(ev))
				bt.Queue(`INSERT INTO ob.lc (part, event, idempotency_key, payload)
					SELECT pt, e, k, p::jsonb FROM unnest($1::smallint[], $2::text[], $3::text[], $4::text[]) AS u(pt, e, k, p)`, ev, es, ks, ps)
			},
			claim: func(bt *pgx.Batch, p int, floor int64) {
				bt.Queue(fmt.Sprintf(claimCols, "ob.lc")+" AND part = $3 ORDER BY id LIMIT $1 FOR UPDATE", batch, floor, p)
			},
			del: func(bt *pgx.Batch, p int, ids []int64) {
				bt.Queue(`DELETE FROM ob.lc WHERE id = ANY($1)`, ids)
			},
		},
	}
	for _, name := range []string{"tables", "column"} {
		l := layouts[name]
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			pool := setup(b)
			if _, err := pool.Exec(ctx, l.ddl); err != nil {
				b.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			var sendT, passT time.Duration
			floors := make([]int64, parts) // each partition's claim floor: above its last claimed row
			ev := make([]int, perTx)
			for b.Loop() {
				t0 := time.Now()
				for range txs {
					for i := range ev {
						ev[i] = rng.IntN(parts)
					}
					bt := &pgx.Batch{}
					l.send(bt, ev)
					if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return tx.SendBatch(ctx, bt).Close() }); err != nil {
						b.Fatal(err)
					}
				}
				t1 := time.Now()
				claimed := 0
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					bt := &pgx.Batch{}
					ids := make([][]int64, parts)
					for p := range parts {
						l.claim(bt, p, floors[p])
						bt.QueuedQueries[len(bt.QueuedQueries)-1].Query(func(rows pgx.Rows) error {
							var err error
							ids[p], err = pgx.CollectRows(rows, pgx.RowTo[int64])
							return err
						})
					}
					if err := tx.SendBatch(ctx, bt).Close(); err != nil {
						return err
					}
					bt = &pgx.Batch{}
					for p := range parts {
						if len(ids[p]) > 0 {
							claimed += len(ids[p])
							floors[p] = ids[p][len(ids[p])-1] + 1
							l.del(bt, p, ids[p])
						}
					}
					return tx.SendBatch(ctx, bt).Close()
				})
				if err != nil {
					b.Fatal(err)
				}
				if claimed != txs*perTx {
					b.Fatalf("the pass claimed %d rows, want %d", claimed, txs*perTx)
				}
				passT += time.Since(t1)
				sendT += t1.Sub(t0)
			}
			n := float64(b.N * txs * perTx)
			b.ReportMetric(float64(sendT.Nanoseconds())/n/1e3, "send-µs/event")
			b.ReportMetric(float64(passT.Nanoseconds())/n/1e3, "pass-µs/event")
		})
	}
}
