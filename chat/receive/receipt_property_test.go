package receive

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"reflect"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/chat/schema"
	"github.com/outboxchat/outboxchat/chat/store"
	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/outbox"
)

// quietInbox is a Consumer config without the duplicates' log lines.
func quietInbox() *inbox.Config {
	return &inbox.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// Property tests of the insert-only receipts (migration 007): random
// orders, batchings, duplicates, late seqs, two inbox transactions
// interleaved statement by statement, crashes before the commit and
// between the commit and the ack, and the migration from 006. After every
// commit, with SQL against the receiver's tables:
//
//	(a) every receipt N of chat C: seqs 1..N of C are all in the inbox;
//	(d) every row not held has every lower seq of its chat in the inbox,
//	    and so does every gap fill;
//
// and, one transaction at a time, each batch's receipt is exactly the
// chat's contiguous top; at the end (after one more delivery per chat, as
// the re-drive sends) every chat's receipt is its top seq.

// receiptProp is one seeded run's deliveries on the workers' inbox.
type receiptProp struct {
	// stats of the interleaved runs
	blocked, aborted, txs int
	t                     *testing.T
	h                     *chattest.Harness
	rng                   *rand.Rand
	chats                 []int64
	n                     int64 // seqs per chat: 1..n
	ids                   map[[2]int64]string
}

func newReceiptProp(t *testing.T, h *chattest.Harness, seed int64, chats []int64, n int64) *receiptProp {
	return &receiptProp{t: t, h: h, rng: rand.New(rand.NewSource(seed)), chats: chats, n: n, ids: map[[2]int64]string{}}
}

func (p *receiptProp) delivery(chatN, seq int64) inbox.Delivery {
	k := [2]int64{chatN, seq}
	if p.ids[k] == "" {
		p.ids[k] = uuid.NewString()
	}
	id := p.ids[k]
	b, _ := json.Marshal(chat.Message{ID: id, ChatID: chatN, Seq: seq, Body: "b", SentAt: time.Now(), From: chat.Consumers})
	return inbox.Delivery{ID: id, Ref: fmt.Sprintf("%d-%d", chatN, seq), Name: chat.EventMessageCreated, Payload: b}
}

// batches returns every (chat, seq) of the run, shuffled, about a tenth
// of them withheld to the end, with duplicates (later in the stream and
// inside a batch), in batches of 1..8 deliveries.
func (p *receiptProp) batches(skip map[[2]int64]bool, maxBatch int) [][]inbox.Delivery {
	var all, late [][2]int64
	for _, c := range p.chats {
		for s := int64(1); s <= p.n; s++ {
			k := [2]int64{c, s}
			if skip[k] {
				continue
			}
			if p.rng.Intn(10) == 0 {
				late = append(late, k)
			} else {
				all = append(all, k)
			}
		}
	}
	p.rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	p.rng.Shuffle(len(late), func(i, j int) { late[i], late[j] = late[j], late[i] })
	all = append(all, late...)
	var stream [][2]int64
	for i, k := range all {
		stream = append(stream, k)
		if p.rng.Intn(7) == 0 { // a duplicate of something already sent
			stream = append(stream, all[p.rng.Intn(i+1)])
		}
	}
	var out [][]inbox.Delivery
	for len(stream) > 0 {
		n := min(1+p.rng.Intn(maxBatch), len(stream))
		var b []inbox.Delivery
		for _, k := range stream[:n] {
			b = append(b, p.delivery(k[0], k[1]))
		}
		if p.rng.Intn(10) == 0 { // the same delivery twice in one batch
			b = append(b, b[p.rng.Intn(len(b))])
		}
		out = append(out, b)
		stream = stream[n:]
	}
	return out
}

// check fails the test when (a) or (d) is broken for the run's chats.
func (p *receiptProp) check(when string) {
	p.t.Helper()
	ctx := context.Background()
	for _, q := range []struct{ what, sql string }{
		{"(d) rows not held with a lower seq missing", `SELECT coalesce(string_agg(i.chat_id || '/' || i.seq, ' '), '') FROM workers.inbox i
			WHERE i.chat_id = ANY($1) AND NOT i.held
			  AND (SELECT count(*) FROM workers.inbox j WHERE j.chat_id = i.chat_id AND j.seq <= i.seq) <> i.seq`},
		{"(d) gap fills with a lower seq missing", `SELECT coalesce(string_agg(g.chat_id || '/' || g.upto, ' '), '') FROM workers.inbox_gap_fills g
			WHERE g.chat_id = ANY($1)
			  AND (SELECT count(*) FROM workers.inbox j WHERE j.chat_id = g.chat_id AND j.seq <= g.upto) <> g.upto`},
		{"(a) receipts claiming a seq the inbox lacks", `SELECT coalesce(string_agg(x.chat || '/' || x.upto, ' '), '') FROM (
				SELECT (c->>'chat_id')::bigint AS chat, (c->>'upto_seq')::bigint AS upto
				FROM workers.outbox o, jsonb_array_elements(o.payload->'chats') c WHERE o.event = 'receipt') x
			WHERE x.chat = ANY($1)
			  AND (SELECT count(*) FROM workers.inbox j WHERE j.chat_id = x.chat AND j.seq <= x.upto) <> x.upto`},
	} {
		var bad string
		if err := p.h.Admin.QueryRow(ctx, q.sql, p.chats).Scan(&bad); err != nil {
			p.t.Fatalf("%s: %s: %v", when, q.what, err)
		}
		if bad != "" {
			p.t.Fatalf("%s: %s: %s\ninbox: %s", when, q.what, bad, p.inboxState())
		}
	}
}

// inboxState is the run's inbox as chat:seq[h]... for failure messages.
func (p *receiptProp) inboxState() string {
	var s string
	_ = p.h.Admin.QueryRow(context.Background(), `SELECT coalesce(string_agg(chat_id || '/' || seq || CASE WHEN held THEN 'h' ELSE '' END, ' ' ORDER BY chat_id, seq), '')
		FROM workers.inbox WHERE chat_id = ANY($1)`, p.chats).Scan(&s)
	var g string
	_ = p.h.Admin.QueryRow(context.Background(), `SELECT coalesce(string_agg(chat_id || '/' || upto, ' ' ORDER BY chat_id, upto), '')
		FROM workers.inbox_gap_fills WHERE chat_id = ANY($1)`, p.chats).Scan(&g)
	return s + "\ngap fills: " + g
}

// contiguous is each chat's highest seq with every seq below it in the
// inbox (committed rows).
func (p *receiptProp) contiguous() map[int64]int64 {
	p.t.Helper()
	rows, err := p.h.Admin.Query(context.Background(), `SELECT chat_id, array_agg(seq ORDER BY seq) FROM workers.inbox WHERE chat_id = ANY($1) GROUP BY chat_id`, p.chats)
	if err != nil {
		p.t.Fatal(err)
	}
	out := map[int64]int64{}
	for rows.Next() {
		var c int64
		var seqs []int64
		if err := rows.Scan(&c, &seqs); err != nil {
			p.t.Fatal(err)
		}
		for i, s := range seqs {
			if s != int64(i+1) {
				break
			}
			out[c] = s
		}
	}
	if err := rows.Err(); err != nil {
		p.t.Fatal(err)
	}
	return out
}

// lastReceipts is, per chat, the upto of its newest receipt (by outbox id)
// and the highest upto of all its receipts.
func (p *receiptProp) lastReceipts() (last, highest map[int64]int64) {
	p.t.Helper()
	rows, err := p.h.Admin.Query(context.Background(), `SELECT (c->>'chat_id')::bigint, (c->>'upto_seq')::bigint
		FROM workers.outbox o, jsonb_array_elements(o.payload->'chats') c
		WHERE o.event = 'receipt' AND (c->>'chat_id')::bigint = ANY($1) ORDER BY o.id`, p.chats)
	if err != nil {
		p.t.Fatal(err)
	}
	last, highest = map[int64]int64{}, map[int64]int64{}
	for rows.Next() {
		var c, u int64
		if err := rows.Scan(&c, &u); err != nil {
			p.t.Fatal(err)
		}
		last[c], highest[c] = u, max(highest[c], u)
	}
	if err := rows.Err(); err != nil {
		p.t.Fatal(err)
	}
	return last, highest
}

// heal sends one delivery per chat again, as the re-drive does for the
// messages above a receipt, and checks that every chat's receipt is then
// its top seq n.
func (p *receiptProp) heal(c *inbox.Consumer) {
	p.t.Helper()
	var b []inbox.Delivery
	for _, chatN := range p.chats {
		b = append(b, p.delivery(chatN, p.n))
	}
	if err := c.ProcessBatch(context.Background(), b); err != nil {
		p.t.Fatal(err)
	}
	p.check("after the re-drive's duplicates")
	last, _ := p.lastReceipts()
	for _, chatN := range p.chats {
		if last[chatN] != p.n {
			p.t.Fatalf("chat %d: receipt %d after every seq arrived and a re-driven duplicate, want %d\ninbox: %s", chatN, last[chatN], p.n, p.inboxState())
		}
	}
}

// sequential feeds the batches through one consumer, one transaction at a
// time, checking after each that (a) and (d) hold and that the batch's
// receipt gives each of its chats exactly its contiguous top.
func (p *receiptProp) sequential(c *inbox.Consumer, bs [][]inbox.Delivery) {
	p.t.Helper()
	ctx := context.Background()
	for i, b := range bs {
		if err := c.ProcessBatch(ctx, b); err != nil {
			p.t.Fatal(err)
		}
		when := fmt.Sprintf("after batch %d", i)
		p.check(when)
		want := p.contiguous()
		last, _ := p.lastReceipts()
		for _, d := range b {
			var m chat.Message
			_ = json.Unmarshal(d.Payload, &m)
			if last[m.ChatID] != want[m.ChatID] {
				p.t.Fatalf("%s: chat %d: receipt %d, want the contiguous top %d\ninbox: %s", when, m.ChatID, last[m.ChatID], want[m.ChatID], p.inboxState())
			}
		}
	}
}

// One consumer, one transaction at a time: the receipts are exact.
func TestReceiptPropertySequential(t *testing.T) {
	t.Parallel()
	h := chattest.New(t, "")
	_, _, c, _ := inboxConsumer(t, h, chat.Workers, quietInbox())
	for _, seed := range []int64{1, 2, 3, 4, 5, 6} {
		chats := []int64{seed*10 + 1, seed*10 + 2, seed*10 + 3}
		p := newReceiptProp(t, h, seed, chats, 30)
		p.sequential(c, p.batches(nil, 8))
		p.heal(c)
	}
}

// txRun is one inbox transaction driven a statement at a time on its own
// connection: BEGIN, the handler's statements, then COMMIT (or ROLLBACK:
// a consumer that crashed before its commit).
type txRun struct {
	name     string
	conn     *pgxpool.Conn
	pid      uint32
	ds       []inbox.Delivery
	steps    []string
	args     [][]any
	next     int
	inflight chan error
	done     bool
	// outcome once done: committed or not (then its deliveries come again)
	committed bool
}

func (p *receiptProp) newTxRun(ctx context.Context, name string, pool *pgxpool.Pool, wh *InboxHandler, ds []inbox.Delivery) *txRun {
	p.t.Helper()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		p.t.Fatal(err)
	}
	r := &txRun{name: name, conn: conn, pid: conn.Conn().PgConn().PID(), ds: ds}
	b := &pgx.Batch{}
	rs := make([]inbox.BatchResult, len(ds))
	if err := wh.QueueBatch(b, ds, rs); err != nil {
		p.t.Fatal(err)
	}
	r.steps, r.args = append(r.steps, "BEGIN"), append(r.args, nil)
	for _, q := range b.QueuedQueries {
		r.steps, r.args = append(r.steps, q.SQL), append(r.args, q.Arguments)
	}
	end := "COMMIT"
	if p.rng.Intn(10) == 0 {
		end = "ROLLBACK"
	}
	r.steps, r.args = append(r.steps, end), append(r.args, nil)
	return r
}

// launch runs r's next statement in the background.
func (r *txRun) launch(ctx context.Context) {
	sql, args := r.steps[r.next], r.args[r.next]
	r.next++
	ch := make(chan error, 1)
	r.inflight = ch
	go func() {
		_, err := r.conn.Exec(ctx, sql, args...)
		ch <- err
	}()
}

// finish records the end of r's statement in flight: on an error (a
// deadlock with the other transaction) r rolls back.
func (r *txRun) finish(ctx context.Context, err error) {
	r.inflight = nil
	if err != nil {
		_, _ = r.conn.Exec(ctx, "ROLLBACK")
		r.done = true
		return
	}
	if r.next == len(r.steps) {
		r.done, r.committed = true, r.steps[r.next-1] == "COMMIT"
	}
}

// interleaved runs a and b's statements in a random interleaving: a
// statement that waits for a lock of the other transaction stays in
// flight while the other goes on. It returns when both have ended.
func (p *receiptProp) interleaved(ctx context.Context, txs ...*txRun) {
	p.t.Helper()
	for {
		var runnable []*txRun
		for _, r := range txs {
			if r.inflight != nil {
				select {
				case err := <-r.inflight:
					r.finish(ctx, err)
				default:
				}
			}
			if !r.done && r.inflight == nil {
				runnable = append(runnable, r)
			}
		}
		if len(runnable) == 0 {
			// Every one left has a statement in flight: wait for the first
			// to end (one that waits for a lock ends when the other
			// commits, or on a deadlock).
			var cases []reflect.SelectCase
			var who []*txRun
			for _, r := range txs {
				if r.inflight != nil {
					cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(r.inflight)})
					who = append(who, r)
				}
			}
			if len(cases) == 0 {
				return
			}
			i, v, _ := reflect.Select(cases)
			err, _ := v.Interface().(error)
			who[i].finish(ctx, err)
			continue
		}
		r := runnable[p.rng.Intn(len(runnable))]
		r.launch(ctx)
		// Wait until the statement ends or waits for the other's lock.
		for r.inflight != nil {
			select {
			case err := <-r.inflight:
				r.finish(ctx, err)
				continue
			default:
			}
			var blocked bool
			if err := p.h.Admin.QueryRow(ctx, `SELECT cardinality(pg_blocking_pids($1)) > 0`, int32(r.pid)).Scan(&blocked); err != nil {
				p.t.Fatal(err)
			}
			if blocked {
				p.blocked++
				break
			}
		}
	}
}

// Two inbox consumers (two pools) whose transactions interleave statement
// by statement, with crashes before the commit and between the commit and
// the ack: (a) and (d) after every transaction, and each chat's receipt
// at its contiguous top after every step (the chat locks serialise them).
func TestReceiptPropertyTwoConsumersInterleaved(t *testing.T) {
	t.Parallel()
	h := chattest.New(t, "")
	ctx := context.Background()
	var pools [2]*pgxpool.Pool
	for i := range pools {
		pool, err := pgxpool.New(ctx, h.RoleURL(chat.Workers))
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		pools[i] = pool
	}
	wh, _ := NewInboxHandler(chat.Workers, nil)
	c, err := inbox.NewConsumer(pools[0], &recordingSource{}, wh, quietInbox())
	if err != nil {
		t.Fatal(err)
	}
	lagged, behind := 0, 0
	for seed := int64(100); seed < 112; seed++ {
		chats := []int64{seed*10 + 1, seed*10 + 2}
		p := newReceiptProp(t, h, seed, chats, 20)
		queue := p.batches(nil, 3)
		for step := 0; len(queue) > 0; step++ {
			if step > 10000 {
				t.Fatal("the deliveries never all committed")
			}
			var txs []*txRun
			for i := 0; i < 2 && len(queue) > 0; i++ {
				txs = append(txs, p.newTxRun(ctx, fmt.Sprint("consumer", i), pools[i], wh, queue[0]))
				queue = queue[1:]
			}
			p.interleaved(ctx, txs...)
			for _, r := range txs {
				r.conn.Release()
				p.txs++
				if !r.committed {
					p.aborted++
				}
				switch {
				case !r.committed: // not acked: the stream delivers it again
					queue = append(queue, r.ds)
				case p.rng.Intn(6) == 0: // committed, crashed before the ack
					queue = append(queue, r.ds)
				}
			}
			p.check(fmt.Sprintf("seed %d step %d", seed, step))
			want := p.contiguous()
			_, highest := p.lastReceipts()
			for _, chatN := range chats {
				if highest[chatN] < want[chatN] {
					behind++
				}
			}
		}
		_, highest := p.lastReceipts()
		for _, chatN := range chats {
			if highest[chatN] < p.n {
				lagged++
			}
		}
		p.heal(c)
		t.Logf("seed %d: %d transactions, %d not committed, %d statements waited for the other's lock", seed, p.txs, p.aborted, p.blocked)
	}
	// The inbox transactions lock their chats (InboxHandler.lockChats), so
	// the second one's receipt sees the first one's rows: no receipt lags.
	if lagged > 0 || behind > 0 {
		t.Fatalf("%d chats' receipts lagged until the re-drive's duplicate; %d times a chat's receipts were behind its contiguous top after a step; want 0", lagged, behind)
	}
}

// Migration 007 from 006 with random inboxes (gaps, rows out of order, an
// inbox_watermarks row at or below the contiguous top): the held flags it
// sets satisfy (d), and the receipts after it, for the remaining seqs in
// random batches, are exact.
func TestReceiptPropertyAfterMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := chattest.New(t, "")
	// newHarness migrated the database; this test wants 006 first: a
	// second database of the same server would do, but resetting two
	// schemas is simpler.
	for _, s := range []string{chat.Consumers, chat.Workers} {
		if _, err := h.Admin.Exec(ctx, `DROP SCHEMA `+s+` CASCADE`); err != nil {
			t.Fatal(err)
		}
		if err := schema.Bootstrap(ctx, h.Admin, s); err != nil {
			t.Fatal(err)
		}
		if _, err := schema.MigrateUpTo(ctx, h.Admin, s, 6); err != nil {
			t.Fatal(err)
		}
	}
	type run struct {
		p    *receiptProp
		skip map[[2]int64]bool
	}
	var runs []run
	for _, seed := range []int64{21, 22, 23, 24, 25, 26} {
		chats := []int64{seed*10 + 1, seed*10 + 2, seed*10 + 3}
		p := newReceiptProp(t, h, seed, chats, 25)
		have := map[[2]int64]bool{}
		for _, c := range chats {
			keep := p.rng.Float64() // how much of the chat arrived before 007
			top := int64(0)
			for s := int64(1); s <= p.n; s++ {
				if p.rng.Float64() < keep {
					have[[2]int64{c, s}] = true
					d := p.delivery(c, s)
					if _, err := h.Admin.Exec(ctx, `INSERT INTO workers.inbox (message_id, chat_id, seq, body, sender, sent_at) VALUES ($1, $2, $3, 'b', 'consumers', now())`, d.ID, c, s); err != nil {
						t.Fatal(err)
					}
					if top == s-1 {
						top = s
					}
				}
			}
			if top > 0 {
				if _, err := h.Admin.Exec(ctx, `INSERT INTO workers.inbox_watermarks (chat_id, upto) VALUES ($1, $2)`, c, 1+p.rng.Int63n(top)); err != nil {
					t.Fatal(err)
				}
			}
		}
		runs = append(runs, run{p, have})
	}
	for _, s := range []string{chat.Consumers, chat.Workers} {
		if n, err := schema.MigrateUpTo(ctx, h.Admin, s, 7); err != nil || n != 1 {
			t.Fatalf("migrate %s: %d, %v; want migration 007 applied", s, n, err)
		}
		// The later migrations too: the handler of today names their
		// columns (011's traceparent and stream_id).
		if _, err := schema.Migrate(ctx, h.Admin, s); err != nil {
			t.Fatalf("migrate %s: %v", s, err)
		}
	}
	_, _, c, _ := inboxConsumer(t, h, chat.Workers, quietInbox())
	for _, r := range runs {
		r.p.check("after migration 007")
		r.p.sequential(c, r.p.batches(r.skip, 8))
		r.p.heal(c)
	}
}

// The sender's side: random receipts (several chats each, uptos growing
// per chat up to a final one, shuffled, repeated, in random batches)
// applied by two inbox consumers at once. Then each chat's messages up to
// its highest receipt, and no others, have delivered_at (the view and
// DeliveredUpTo); and the re-drive, going round the chats a few at a time
// with small passes, publishes each message above its chat's receipt
// exactly once and nothing at or below it.
func TestReceiptPropertySenderAndRedrive(t *testing.T) {
	t.Parallel()
	h := chattest.New(t, "")
	ctx := context.Background()
	var pools [2]*pgxpool.Pool
	var cs [2]*inbox.Consumer
	ch, _ := NewInboxHandler(chat.Consumers, nil)
	for i := range pools {
		pool, err := pgxpool.New(ctx, h.RoleURL(chat.Consumers))
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		pools[i] = pool
		if cs[i], err = inbox.NewConsumer(pool, &recordingSource{}, ch, quietInbox()); err != nil {
			t.Fatal(err)
		}
	}
	for _, seed := range []int64{31, 32, 33, 34, 35, 36} {
		rng := rand.New(rand.NewSource(seed))
		const n = 20
		chats := []int64{seed*10 + 1, seed*10 + 2, seed*10 + 3, seed*10 + 4}
		if _, err := pools[0].Exec(ctx, `INSERT INTO consumers.messages (chat_id, seq, body, created_at)
			SELECT c, s, 'x', now() - interval '1 day' FROM unnest($1::bigint[]) c, generate_series(1, $2::int) s`, chats, n); err != nil {
			t.Fatal(err)
		}
		final := map[int64]int64{}
		var entries []chat.ReceiptChat
		for _, c := range chats {
			final[c] = rng.Int63n(n + 1)
			for u := int64(0); u < final[c]; {
				u = min(final[c], u+1+rng.Int63n(5))
				entries = append(entries, chat.ReceiptChat{ChatID: c, UptoSeq: u})
			}
		}
		rng.Shuffle(len(entries), func(i, j int) { entries[i], entries[j] = entries[j], entries[i] })
		var ds []inbox.Delivery
		for len(entries) > 0 {
			k := min(1+rng.Intn(3), len(entries))
			id := uuid.NewString()
			p, _ := json.Marshal(chat.Receipt{ID: id, Chats: entries[:k], ReceivedAt: time.Now().Add(time.Duration(rng.Intn(1000)) * time.Millisecond), From: chat.Workers})
			ds = append(ds, inbox.Delivery{ID: id, Ref: "r-" + id, Name: chat.EventReceipt, Payload: p})
			if rng.Intn(5) == 0 {
				ds = append(ds, ds[rng.Intn(len(ds))])
			}
			entries = entries[k:]
		}
		var batches [2][][]inbox.Delivery
		for len(ds) > 0 {
			k := min(1+rng.Intn(3), len(ds))
			i := rng.Intn(2)
			batches[i] = append(batches[i], ds[:k])
			ds = ds[k:]
		}
		chattest.Concurrently(t, len(cs), func(i int) error {
			for _, b := range batches[i] {
				if err := cs[i].ProcessBatch(ctx, b); err != nil {
					return err
				}
			}
			return nil
		})
		w, err := outbox.NewWriter(nil, &outbox.WriterConfig{Table: "consumers.outbox", Mode: outbox.WakeNone})
		if err != nil {
			t.Fatal(err)
		}
		st, err := store.New(pools[0], &store.Config{Service: chat.Consumers, Writer: w})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range chats {
			var delivered, top int64
			if err := h.Admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE delivered_at IS NOT NULL), coalesce(max(seq) FILTER (WHERE delivered_at IS NOT NULL), 0)
				FROM consumers.messages_with_receipts WHERE chat_id = $1`, c).Scan(&delivered, &top); err != nil {
				t.Fatal(err)
			}
			if delivered != final[c] || top != final[c] {
				t.Fatalf("seed %d chat %d: %d messages delivered, the highest %d; want 1..%d", seed, c, delivered, top, final[c])
			}
			if up, _, err := st.DeliveredUpTo(ctx, c); err != nil || up != final[c] {
				t.Fatalf("seed %d chat %d: DeliveredUpTo %d, %v; want %d", seed, c, up, err, final[c])
			}
		}
		pub := &recordingRepublisher{}
		rd, err := NewRedriver(pools[0], chat.Consumers, pub, &RedriveConfig{After: time.Hour, ChatsPerPass: 1 + rng.Intn(3), MaxPerPass: 1 + rng.Intn(4)})
		if err != nil {
			t.Fatal(err)
		}
		want := 0
		for _, c := range chats {
			want += int(n - final[c])
		}
		// Until every message due was published, and then a few rounds
		// more (the other seeds' chats are in the table too), which must
		// publish none of them again.
		seen := map[[2]int64]int{}
		last := map[int64]int64{}
		read := 0
		for pass, extra := 0, -1; extra != 0; pass++ {
			if pass > 2000 {
				t.Fatalf("seed %d: %d of %d due messages re-driven after 2000 passes", seed, len(seen), want)
			}
			if _, err := rd.RunOnce(ctx); err != nil {
				t.Fatal(err)
			}
			for _, j := range pub.jobs[read:] {
				m, err := chat.DecodeEvent(j.Payload)
				if err != nil {
					t.Fatal(err)
				}
				if _, ok := final[m.ChatID]; !ok {
					continue // an earlier seed's chat
				}
				seen[[2]int64{m.ChatID, m.Seq}]++
				if m.Seq <= final[m.ChatID] {
					t.Fatalf("seed %d: chat %d seq %d re-driven, though its receipt covers up to %d", seed, m.ChatID, m.Seq, final[m.ChatID])
				}
				if m.Seq <= last[m.ChatID] {
					t.Fatalf("seed %d: chat %d re-driven out of order: %d after %d", seed, m.ChatID, m.Seq, last[m.ChatID])
				}
				last[m.ChatID] = m.Seq
			}
			read = len(pub.jobs)
			switch {
			case extra > 0:
				extra--
			case extra < 0 && len(seen) == want:
				extra = 3 * len(chats) * int(seed-30)
			}
		}
		for _, c := range chats {
			for s := final[c] + 1; s <= n; s++ {
				if seen[[2]int64{c, s}] != 1 {
					t.Fatalf("seed %d: chat %d seq %d re-driven %d times, want once", seed, c, s, seen[[2]int64{c, s}])
				}
			}
		}
	}
}
