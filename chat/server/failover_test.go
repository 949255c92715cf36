package server

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/chat/status"
	"github.com/outboxchat/outboxchat/internal/pgproc"
	"github.com/outboxchat/outboxchat/internal/testenv"
)

// TestPostgresFailoverReusesNoSeq fails Postgres over to an asynchronous
// streaming replica that lost the last commits: a real standby
// (pg_basebackup), its replication cut, three messages committed on the
// primary alone (2xx, published, shown), the primary killed (SIGKILL), the
// standby promoted. The services, given both servers in their URL with
// target_session_attrs=read-write, reconnect to it by themselves. Then:
// every message that got a 2xx before the cut and after the promotion is
// delivered and ✓✓; the three only the old primary had are reported lost
// by status; the sends after the promotion take seqs above every seq
// handed out before (none reused); nothing is shown twice; no ✓✓ is for a
// message the receiver does not hold.
func TestPostgresFailoverReusesNoSeq(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	primary := testenv.PrivatePostgres(t)
	h := newHarnessOn(t, primary.AdminURL(), "")
	standby, err := pgproc.Start(ctx, &pgproc.Options{StandbyOf: primary})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = standby.Close() })
	both := func(service string) string {
		return fmt.Sprintf("postgres://%s@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable&target_session_attrs=read-write&connect_timeout=2",
			service, primary.Port(), standby.Port(), pgproc.DefaultDatabase)
	}
	start := func(service string) *running {
		return h.start(service, func(c *Config) { c.DatabaseURL = both(service) })
	}
	cons, work := start(chat.Consumers), start(chat.Workers)
	const chatID = 41
	shown := chattest.Watch(t, work.base, chatID)      // the receiver's client, open throughout
	senderView := chattest.Watch(t, cons.base, chatID) // the sender's client: ✓✓ frames

	var before, during, after []chat.Message
	for i := 1; i <= 3; i++ {
		before = append(before, chattest.Send(t, cons.base, chatID, fmt.Sprint("before the cut ", i)))
	}
	shown.WaitSeqs(t, chat.Consumers, 3, 10*time.Second)
	if err := standby.WaitCaughtUp(ctx, primary, 0); err != nil {
		t.Fatal(err)
	}
	if err := standby.CutReplication(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		during = append(during, chattest.Send(t, cons.base, chatID, fmt.Sprint("only the old primary ", i)))
	}
	shown.WaitSeqs(t, chat.Consumers, 6, 10*time.Second)
	testenv.WaitFor(t, 10*time.Second, "✓✓ up to 6 before the primary dies", func() bool {
		return senderView.LastReceipt(chat.Consumers).UptoSeq >= 6
	})
	if err := primary.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		body := fmt.Sprint("after the promotion ", i)
		var m chat.Message
		testenv.WaitFor(t, 30*time.Second, "a 2xx for "+body, func() bool {
			code, raw := chattest.Post(t, cons.base, fmt.Sprint(chatID), `{"body":`+chattest.JSONString(body)+`}`)
			switch {
			case code == http.StatusCreated:
				m = decodeMessage(t, raw)
				return true
			case code < 500:
				t.Fatalf("send %q: status %d: %s", body, code, raw)
			}
			return false
		})
		after = append(after, m)
	}

	// From here on the database is the promoted standby.
	adm, err := pgxpool.New(ctx, standby.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	count := func(query string, args ...any) int {
		t.Helper()
		var n int
		if err := adm.QueryRow(ctx, query, args...).Scan(&n); err != nil {
			t.Fatalf("%s: %v", query, err)
		}
		return n
	}
	// No seq reused: the sends after the promotion are above every seq
	// handed out before it, including the lost ones.
	for _, m := range after {
		if m.Seq <= during[len(during)-1].Seq {
			t.Errorf("message %q got seq %d after the promotion: seqs up to %d were handed out before (reused)", m.Body, m.Seq, during[len(during)-1].Seq)
		}
	}
	// Delivered, shown once each, ✓✓ on the sender.
	testenv.WaitFor(t, 30*time.Second, "the sends after the promotion shown on the receiver's socket", func() bool {
		return len(shown.From(chat.Consumers)) >= 9
	})
	seen := map[string]int{}
	for _, m := range shown.From(chat.Consumers) {
		seen[m.ID]++
	}
	for _, m := range append(append(append([]chat.Message(nil), before...), during...), after...) {
		if seen[m.ID] != 1 {
			t.Errorf("message %q (seq %d) shown %d times on the receiver's socket, want once", m.Body, m.Seq, seen[m.ID])
		}
	}
	testenv.WaitFor(t, 30*time.Second, "✓✓ for the sends after the promotion", func() bool {
		return count(`SELECT count(*) FROM consumers.messages m WHERE m.chat_id = $1 AND m.seq <= coalesce(
			(SELECT max(r.upto_seq) FROM consumers.receipts r WHERE r.chat_id = m.chat_id), 0)`, chatID) == 6
	})
	// The receiver holds every message the sender still has, under the same
	// ids, and no ✓✓ covers a message it does not hold.
	if n := count(`SELECT count(*) FROM consumers.messages m WHERE m.chat_id = $1
		AND NOT EXISTS (SELECT 1 FROM workers.inbox i WHERE i.message_id = m.id AND i.chat_id = m.chat_id AND i.seq = m.seq)`, chatID); n != 0 {
		t.Errorf("%d of the sender's messages are not in the receiver's inbox under their id and seq", n)
	}
	// The ones only the old primary had are reported lost.
	st, err := status.ReadStatus(ctx, adm, testenv.Redis(t), nil, h.Prefix, status.StatusThresholds{}, status.CommandFlags{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st.Services {
		if s.Service != chat.Consumers {
			continue
		}
		if s.LostSeqs != int64(len(during)) {
			t.Errorf("status reports %d lost seqs for consumers, want %d (those only the old primary had)", s.LostSeqs, len(during))
		}
		if st.Healthy {
			t.Errorf("status is healthy with lost messages")
		}
	}
}
