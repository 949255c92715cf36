package server

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"io"
	"log/slog"
	"regexp"
	"strconv"
	"sync"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/chat/server/internal/retention"
	"github.com/outboxchat/outboxchat/chat/store/prune"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/redisq"
)

// flow is one chat of consumers' messages to a WebSocket client of workers.
type flow struct {
	t          *testing.T
	h          *harness
	cons, work *running
	chat       int64
	w          *chattest.Watcher
}

// newFlow opens the client of chatID and sends seqs 1..n (see send).
func newFlow(t *testing.T, h *harness, cons, work *running, chatID int64, n int) *flow {
	t.Helper()
	f := &flow{t: t, h: h, cons: cons, work: work, chat: chatID, w: chattest.Watch(t, work.base, chatID)}
	f.send(1, n)
	return f
}

// send sends seqs from..to, checks each got its seq, and waits until the
// client has exactly 1..to, in order, and the receipts cover to.
func (f *flow) send(from, to int) {
	f.t.Helper()
	for i := from; i <= to; i++ {
		if m := chattest.Send(f.t, f.cons.base, f.chat, fmt.Sprint("message ", i)); m.Seq != int64(i) {
			f.t.Fatalf("chat %d: message %d got seq %d", f.chat, i, m.Seq)
		}
	}
	f.w.WaitSeqs(f.t, chat.Consumers, to, 20*time.Second)
	testenv.WaitFor(f.t, 20*time.Second, fmt.Sprintf("chat %d: receipt up to %d", f.chat, to), func() bool {
		return f.h.Count(f.t, `SELECT coalesce(max(upto_seq), 0) FROM consumers.receipts WHERE chat_id = $1`, f.chat) == to
	})
}

// An operator deletes a quiet chat's history by hand on the sender, the
// receiver or both, with the sender's receipts deleted too or kept, while
// a WebSocket client of the receiver stays open at the chat's last seq:
// the next messages get the next seqs, reach that client, and are marked
// delivered by receipts that cover them and nothing else; nothing is
// dead-lettered. A message at a seq the receiver holds under another id
// is dead-lettered and counted.
func TestHandDeletedHistoryKeepsChatsFlowing(t *testing.T) {
	t.Parallel()
	h, cons, work := startBoth(t)
	ctx := context.Background()
	cases := []struct {
		chat                    int64
		sender, receipts, inbox bool
	}{
		{21, true, true, false},
		{22, true, false, false},
		{23, false, false, true},
		{24, true, true, true},
		{25, true, false, true},
	}
	flows := map[int64]*flow{}
	for _, c := range cases {
		flows[c.chat] = newFlow(t, h, cons, work, c.chat, 3)
	}
	for _, c := range cases {
		for _, del := range []struct {
			on  bool
			sql string
		}{
			{c.sender, `DELETE FROM consumers.messages WHERE chat_id = $1`},
			{c.receipts, `DELETE FROM consumers.receipts WHERE chat_id = $1`},
			{c.inbox, `DELETE FROM workers.inbox WHERE chat_id = $1`},
		} {
			if del.on {
				if _, err := h.Admin.Exec(ctx, del.sql, c.chat); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	for _, c := range cases {
		flows[c.chat].send(4, 5)
		if n := h.Count(t, `SELECT count(*) FROM consumers.messages_with_receipts
			WHERE chat_id = $1 AND delivered_at < created_at`, c.chat); n != 0 {
			t.Fatalf("chat %d (sender %v, receipts %v, inbox %v): %d messages marked delivered before they were sent",
				c.chat, c.sender, c.receipts, c.inbox, n)
		}
	}
	rdb, err := redisq.NewClient(h.RedisURL)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	qi, err := redisq.Inspect(ctx, rdb, h.Prefix, chat.QueueName(chat.Consumers))
	if err != nil {
		t.Fatal(err)
	}
	dead := qi.DeadLetters
	if dead != 0 {
		t.Fatalf("%d dead letters, want none", dead)
	}

	// A message at a seq the receiver already holds, under another id (a
	// sender that lost its rows and floors): dead-lettered and counted.
	pub, err := redisq.NewPublisher(rdb, &redisq.PublisherConfig{Queue: chat.QueueName(chat.Consumers), Prefix: h.Prefix})
	if err != nil {
		t.Fatal(err)
	}
	id := uuid.NewString()
	payload, _ := json.Marshal(chat.Message{ID: id, ChatID: 21, Seq: 5, Body: "again", SentAt: time.Now(), From: chat.Consumers})
	if _, err := pub.Add(ctx, redisq.Job{ID: id, Name: chat.EventMessageCreated, Payload: payload}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, "the conflicting message dead-lettered and counted", func() bool {
		m, err := chattest.Get(work.base + "/metrics")
		return err == nil && strings.Contains(m, "outboxchat_inbox_seq_conflicts_total 1")
	})
	if n := h.Count(t, `SELECT count(*) FROM workers.inbox WHERE message_id = $1`, id); n != 0 {
		t.Fatal("the conflicting message was stored")
	}
}

// A WebSocket opened after a chat's history was deleted on both sides (the
// sender's messages and the receiver's inbox rows; receipts kept) shows the
// chat's new messages on both services at once: its cursors start at 0, the
// deleted seqs are below each side's floor, so they are skipped rather than
// waited for — for good on the sender's own side, for the gap hold on the
// receiver's. Each new message is shown once.
func TestNewSocketAfterDeletedHistoryShowsNewMessages(t *testing.T) {
	t.Parallel()
	h, cons, work := startBoth(t)
	ctx := context.Background()
	const chatID = 61
	sendsArrive(t, work, cons, chatID, 10*time.Second) // seqs 1..3, delivered and receipted
	testenv.WaitFor(t, 10*time.Second, "receipt up to seq 3", func() bool {
		return h.Count(t, `SELECT count(*) FROM consumers.receipts WHERE chat_id = $1 AND upto_seq >= 3`, chatID) > 0
	})
	for _, q := range []string{
		`DELETE FROM consumers.messages WHERE chat_id = $1`,
		`DELETE FROM workers.inbox WHERE chat_id = $1`,
	} {
		if _, err := h.Admin.Exec(ctx, q, chatID); err != nil {
			t.Fatal(err)
		}
	}
	own := chattest.Watch(t, cons.base, chatID)
	peer := chattest.Watch(t, work.base, chatID)
	// Well under the gap hold (at least 2 × the harness's 2 s lock
	// duration): a wait for the deleted seqs would miss it.
	const within = 3 * time.Second
	for seq := int64(4); seq <= 5; seq++ {
		m := chattest.Send(t, cons.base, chatID, fmt.Sprint("after the delete ", seq))
		if m.Seq != seq {
			t.Fatalf("send after the delete got seq %d, want %d", m.Seq, seq)
		}
		for _, w := range []struct {
			name string
			w    *chattest.Watcher
		}{{"the sender's new socket", own}, {"the receiver's new socket", peer}} {
			testenv.WaitFor(t, within, fmt.Sprintf("seq %d on %s", seq, w.name), func() bool {
				return len(w.w.From(chat.Consumers)) >= int(seq-3)
			})
			got := w.w.From(chat.Consumers)
			if len(got) != int(seq-3) || got[len(got)-1].Seq != seq {
				t.Fatalf("%s shows %+v, want seqs 4..%d once each", w.name, got, seq)
			}
		}
	}
}

// attackDeadLetters is the number of dead letters on both services' queues.
func attackDeadLetters(t *testing.T, h *harness) int64 {
	t.Helper()
	rdb, err := redisq.NewClient(h.RedisURL)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	var n int64
	for _, s := range []string{chat.Consumers, chat.Workers} {
		qi, err := redisq.Inspect(context.Background(), rdb, h.Prefix, chat.QueueName(s))
		if err != nil {
			t.Fatal(err)
		}
		n += int64(qi.DeadLetters)
	}
	return n
}

// attackSettled waits for chat's receipts on consumers to reach n and the
// workers' socket w to hold exactly 1..n of consumers' messages; then
// checks nothing was marked delivered before it was sent and nothing was
// dead-lettered.
func attackSettled(t *testing.T, h *harness, w *chattest.Watcher, chatID int64, n int) {
	t.Helper()
	w.WaitSeqs(t, chat.Consumers, n, 30*time.Second)
	attackReceiptsSettled(t, h, chatID, n)
	w.WaitSeqs(t, chat.Consumers, n, time.Second) // still exactly 1..n, once each
}

// attackSettledDeleting is attackSettled for a chat whose inbox rows were
// deleted while it was being sent to (attackRecordInboxDeletes records
// which): a row deleted before the gateway read it cannot be shown, so the
// socket must show seqs in increasing order, each once, up to n, and every
// seq it skipped must have been deleted from the inbox, and be at or below
// the workers' floor for the chat: a seq skipped otherwise is a message the
// socket lost.
func attackSettledDeleting(t *testing.T, h *harness, w *chattest.Watcher, chatID int64, n int) {
	t.Helper()
	last := func() int64 {
		ms := w.From(chat.Consumers)
		if len(ms) == 0 {
			return 0
		}
		return ms[len(ms)-1].Seq
	}
	testenv.WaitFor(t, 30*time.Second, fmt.Sprintf("seq %d from consumers on the socket", n), func() bool { return last() >= int64(n) })
	attackReceiptsSettled(t, h, chatID, n)
	floor := int64(h.Count(t, `SELECT coalesce(max(upto), 0) FROM workers.inbox_gap_fills WHERE chat_id = $1`, chatID))
	var prev int64
	var skipped []int64
	for _, m := range w.From(chat.Consumers) {
		if m.Seq <= prev {
			t.Fatalf("socket showed seq %d after %d (order or duplicate broken): %+v", m.Seq, prev, w.From(chat.Consumers))
		}
		for q := prev + 1; q < m.Seq; q++ {
			skipped = append(skipped, q)
		}
		prev = m.Seq
	}
	if prev != int64(n) {
		t.Fatalf("socket's last seq is %d, want %d", prev, n)
	}
	for _, q := range skipped {
		if q > floor {
			t.Fatalf("socket skipped seq %d, above the workers' floor %d: lost, not deleted (skipped %v)", q, floor, skipped)
		}
		if h.Count(t, `SELECT count(*) FROM public.attack_deleted WHERE chat_id = $1 AND seq = $2`, chatID, q) == 0 {
			t.Fatalf("socket skipped seq %d, which was never deleted from the inbox: lost (skipped %v)", q, skipped)
		}
	}
	t.Logf("socket showed %d of %d seqs; skipped (deleted before it read them) %v", n-len(skipped), n, skipped)
}

// waitUpTo returns once cond holds or after d, whichever comes first.
func waitUpTo(d time.Duration, cond func() bool) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	end := time.After(d)
	for !cond() {
		select {
		case <-tick.C:
		case <-end:
			return
		}
	}
}

// attackRecordInboxDeletes adds triggers that record every inbox row
// deleted from now on, by DELETE or TRUNCATE, in public.attack_deleted
// (chat_id, seq). SECURITY DEFINER: whoever deletes, the admin writes the
// record.
func attackRecordInboxDeletes(t *testing.T, h *harness) {
	t.Helper()
	for _, sql := range []string{
		`CREATE TABLE public.attack_deleted (chat_id bigint NOT NULL, seq bigint NOT NULL)`,
		`CREATE FUNCTION public.attack_note_deleted() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $$
		BEGIN INSERT INTO public.attack_deleted SELECT chat_id, seq FROM gone; RETURN NULL; END $$`,
		`CREATE FUNCTION public.attack_note_truncated() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $$
		BEGIN INSERT INTO public.attack_deleted SELECT chat_id, seq FROM workers.inbox; RETURN NULL; END $$`,
		`CREATE TRIGGER attack_deleted AFTER DELETE ON workers.inbox REFERENCING OLD TABLE AS gone
		FOR EACH STATEMENT EXECUTE FUNCTION public.attack_note_deleted()`,
		`CREATE TRIGGER attack_truncated BEFORE TRUNCATE ON workers.inbox
		FOR EACH STATEMENT EXECUTE FUNCTION public.attack_note_truncated()`,
	} {
		if _, err := h.Admin.Exec(context.Background(), sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
}

// attackReceiptsSettled waits for chat's receipts on consumers to reach n;
// then checks nothing was marked delivered before it was sent and nothing
// was dead-lettered.
func attackReceiptsSettled(t *testing.T, h *harness, chatID int64, n int) {
	t.Helper()
	testenv.WaitFor(t, 30*time.Second, fmt.Sprintf("chat %d: receipt up to %d", chatID, n), func() bool {
		return h.Count(t, `SELECT coalesce(max(upto_seq), 0) FROM consumers.receipts WHERE chat_id = $1`, chatID) == n
	})
	if got := h.Count(t, `SELECT coalesce(max(upto_seq), 0) FROM consumers.receipts WHERE chat_id = $1`, chatID); got != n {
		t.Fatalf("chat %d: receipt %d, want %d", chatID, got, n)
	}
	if c := h.Count(t, `SELECT count(*) FROM consumers.messages_with_receipts WHERE chat_id = $1 AND delivered_at < created_at`, chatID); c != 0 {
		t.Fatalf("chat %d: %d messages marked delivered before they were sent", chatID, c)
	}
	if d := attackDeadLetters(t, h); d != 0 {
		t.Fatalf("%d dead letters, want none", d)
	}
}

// Attack (a)/(b)/(c): prunes with an --older-than covering every row, two
// at a time on each service, and hand deletes on both sides (middle rows of
// the receiver, covered rows of the sender, TRUNCATE of the receiver's
// inbox) run while a chat is being sent to, with a socket of the receiver
// open throughout: every send gets the next seq, the socket shows seqs up
// to n once each in order, skipping only rows deleted before it read them,
// receipts reach n, nothing is dead-lettered.
func TestAttackPruneAndDeletesWhileSending(t *testing.T) {
	t.Parallel()
	h, cons, work := startBoth(t)
	const chatID, n = 71, 30
	attackRecordInboxDeletes(t, h)
	w := chattest.Watch(t, work.base, chatID)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	loop := func(f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if err := f(); err != nil && ctx.Err() == nil {
					errs <- err
					return
				}
			}
		}()
	}
	for range 2 {
		for _, s := range []string{chat.Consumers, chat.Workers} {
			loop(func() error {
				_, err := prune.Run(ctx, h.Admin, prune.Config{Service: s, OlderThan: time.Nanosecond, Batch: 2})
				return err
			})
		}
	}
	hand := []string{
		`DELETE FROM workers.inbox WHERE chat_id = 71 AND seq % 2 = 0`,
		`DELETE FROM consumers.messages WHERE chat_id = 71 AND seq % 3 = 0
			AND seq <= (SELECT coalesce(max(upto_seq), 0) FROM consumers.receipts WHERE chat_id = 71)`,
		`TRUNCATE workers.inbox`,
		`DELETE FROM consumers.receipts WHERE chat_id = 71 AND upto_seq < (SELECT max(upto_seq) FROM consumers.receipts WHERE chat_id = 71)`,
	}
	i := 0
	loop(func() error {
		i++
		_, err := h.Admin.Exec(ctx, hand[i%len(hand)])
		return err
	})
	for i := 1; i <= n; i++ {
		if m := chattest.Send(t, cons.base, chatID, fmt.Sprint("m ", i)); m.Seq != int64(i) {
			t.Fatalf("message %d got seq %d", i, m.Seq)
		}
	}
	// The deletes go on while the messages are delivered, until the last
	// send is on the socket or for 30 s at most, and then stop: while they
	// go on, an inbox row deleted while held behind a gap proves nothing,
	// so its message waits for a re-drive, whose backoff doubles each time
	// a copy is deleted again, and the last send may wait without bound.
	// Once they stop, every message missing from the inbox is published
	// again within the re-drive's longest backoff (RedriveConfig.MaxBackoff,
	// 16 × RedriveAfter) and a pass.
	lastShown := func() bool {
		ms := w.From(chat.Consumers)
		return len(ms) > 0 && ms[len(ms)-1].Seq >= n
	}
	waitUpTo(30*time.Second, lastShown)
	cancel()
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	redriveAfter := (&Config{LockDuration: 2 * time.Second}).WithDefaults().Relay.RedriveAfter // the harness's
	testenv.WaitFor(t, 16*redriveAfter+5*time.Second, "the last send on the socket", lastShown)
	attackSettledDeleting(t, h, w, chatID, n)
	// The chat goes on after all that.
	if m := chattest.Send(t, cons.base, chatID, "after"); m.Seq != n+1 {
		t.Fatalf("after the deletes: seq %d, want %d", m.Seq, n+1)
	}
	attackSettledDeleting(t, h, w, chatID, n+1)
}

// Attack (a)/(c): the newest message is deleted by hand right after it
// was sent, while its outbox row is still pending (no relay is running
// yet): the next send still gets the next seq, and once a relay runs,
// both reach the receiver's socket in order and receipts cover them.
func TestAttackDeleteNewestBeforeRelay(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	cons := h.startAPI(chat.Consumers, nil)
	work := h.start(chat.Workers, nil)
	const chatID = 72
	w := chattest.Watch(t, work.base, chatID)
	for i := 1; i <= 3; i++ {
		chattest.Send(t, cons.base, chatID, fmt.Sprint("m ", i))
	}
	if p := h.Count(t, `SELECT count(*) FROM consumers.outbox`); p != 3 {
		t.Fatalf("%d outbox rows pending, want 3", p)
	}
	if _, err := h.Admin.Exec(context.Background(), `DELETE FROM consumers.messages WHERE chat_id = $1 AND seq = 3`, chatID); err != nil {
		t.Fatal(err)
	}
	if m := chattest.Send(t, cons.base, chatID, "m 4"); m.Seq != 4 {
		t.Fatalf("after deleting pending seq 3: seq %d, want 4", m.Seq)
	}
	h.start(chat.Consumers, func(c *Config) { c.Roles = []string{RoleRelay, RoleWorker} })
	attackSettled(t, h, w, chatID, 4)
}

// attackMetric reads an unlabelled counter from base's /metrics (0 when
// absent).
func attackMetric(t *testing.T, base, name string) float64 {
	t.Helper()
	m, err := chattest.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	g := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindStringSubmatch(m)
	if g == nil {
		return 0
	}
	v, _ := strconv.ParseFloat(g[1], 64)
	return v
}

// attackRestoreSender models a restore of consumers that lost chatID's
// messages above keep and its receipts above keep: the delete trigger is
// disabled, so no floor is recorded (a restore fires none).
func attackRestoreSender(t *testing.T, h *harness, chatID int64, keep int) {
	t.Helper()
	for _, sql := range []string{
		`ALTER TABLE consumers.messages DISABLE TRIGGER messages_seq_floor`,
		fmt.Sprintf(`DELETE FROM consumers.messages WHERE chat_id = %d AND seq > %d`, chatID, keep),
		`ALTER TABLE consumers.messages ENABLE TRIGGER messages_seq_floor`,
		fmt.Sprintf(`DELETE FROM consumers.receipts WHERE chat_id = %d AND upto_seq > %d`, chatID, keep),
		fmt.Sprintf(`INSERT INTO consumers.receipts (chat_id, upto_seq, delivered_at) VALUES (%d, %d, now()) ON CONFLICT DO NOTHING`, chatID, keep),
	} {
		if _, err := h.Admin.Exec(context.Background(), sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
}

// Attack (b)/(d), sender restored without its last rows while the
// receiver still holds them: the sender hands seq 4 out again (a restore
// fires no trigger: expected), the receiver dead-letters it as a seq
// conflict and counts it, and the sender does not show it delivered.
// Then the chat's next messages get past it: once the sender's seq is
// above the receiver's, the chat flows again.
func TestAttackRestoredSenderConflictIsDetected(t *testing.T) {
	t.Parallel()
	h, cons, work := startBoth(t)
	const chatID = 81
	f := newFlow(t, h, cons, work, chatID, 5)
	attackRestoreSender(t, h, chatID, 3)
	m := chattest.Send(t, cons.base, chatID, "after the restore")
	if m.Seq != 4 {
		t.Fatalf("after the restore: seq %d (expected 4: nothing recorded what was lost)", m.Seq)
	}
	testenv.WaitFor(t, 20*time.Second, "the reused seq 4 dead-lettered as a seq conflict", func() bool {
		return attackMetric(t, work.base, "outboxchat_inbox_seq_conflicts_total") >= 1
	})
	if n := h.Count(t, `SELECT count(*) FROM workers.inbox WHERE message_id = $1`, m.ID); n != 0 {
		t.Fatal("the conflicting message was stored")
	}
	if n := h.Count(t, `SELECT count(*) FROM consumers.messages_with_receipts WHERE id = $1 AND delivered_at IS NOT NULL`, m.ID); n != 0 {
		t.Fatal("the dead-lettered message at reused seq 4 is shown delivered while no receipt covers it")
	}
	if got := len(f.w.From(chat.Consumers)); got != 5 {
		t.Fatalf("socket shows %d messages, want the 5 before the restore", got)
	}
}

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
		r := retention.New(h.Admin, svc, 24*time.Hour, func(table string, n int64) { metric[svc+"."+table] += n }, log)
		n, err := r.RunOnce(ctx)
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
	pruneAll := func(svc string) prune.Counts {
		t.Helper()
		n, err := prune.Run(ctx, h.Admin, prune.Config{Service: svc, OlderThan: 24 * time.Hour, Batch: 2})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	got := fmt.Sprint(pruneAll(chat.Consumers), pruneAll(chat.Workers))
	want := fmt.Sprint(
		prune.Counts{"messages": 4, "receipts": 1, "inbox": 0, "inbox_gap_fills": 0, "inbox_duplicates": 0, "seq_floors": 1},
		prune.Counts{"messages": 0, "receipts": 0, "inbox": 3, "inbox_gap_fills": 2, "inbox_duplicates": 1, "seq_floors": 0})
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
