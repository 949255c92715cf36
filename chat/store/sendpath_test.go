package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/outbox"
)

// TestSeqInvariantsConcurrentOneChat: many senders in two Stores (two API
// processes, each with its own pool and committer) send to one chat at
// once, some with idempotency keys sent twice: per chat the seqs are 1..N
// without a gap, each message has one outbox event, outbox ids ascend with
// seq (commit order), each sender's own sends ascend, and a repeated key
// stored one message. The two committers contend for the chat's lock, so
// sends also go through the slow lanes.
func TestSeqInvariantsConcurrentOneChat(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t, outbox.WakeAfterCommit)
	ctx := context.Background()
	s2 := e.secondStore(t)

	const senders, each = 12, 60
	var (
		mu       sync.Mutex
		byKey    = map[string]chat.Message{}
		replayed int
		wg       sync.WaitGroup
	)
	for g := range senders {
		store := e.store
		if g%2 == 1 {
			store = s2
		}
		wg.Go(func() {
			var last int64
			for i := range each {
				chatN := int64(1)
				if i%10 == 9 {
					chatN = 2 // a little traffic elsewhere
				}
				key := ""
				if i%3 == 0 {
					key = fmt.Sprintf("g%d-%d", g, i)
				}
				body := fmt.Sprintf("g%d m%d", g, i)
				m, rep, err := store.SendIdempotent(ctx, chatN, body, key, "")
				if err != nil {
					t.Errorf("send: %v", err)
					return
				}
				if chatN == 1 {
					if rep || m.Seq <= last {
						t.Errorf("sender %d: seq %d (replayed %v) after %d", g, m.Seq, rep, last)
					}
					last = m.Seq
				}
				if key == "" {
					continue
				}
				// The same key again, through the other Store: the same
				// message, nothing stored.
				other := s2
				if store == s2 {
					other = e.store
				}
				again, rep, err := other.SendIdempotent(ctx, chatN, body, key, "")
				if err != nil || !rep || !sameMessage(again, m) {
					t.Errorf("repeat of key %s: %+v replayed %v, %v; first %+v", key, again, rep, err, m)
				}
				mu.Lock()
				byKey[key] = m
				replayed++
				mu.Unlock()
			}
		})
	}
	stored := e.checkSent(t, &wg, senders*each)
	if n := e.count(t, `SELECT count(*) FROM consumers.messages WHERE client_id IS NOT NULL`); n != len(byKey) {
		t.Fatalf("%d messages with a key, want %d", n, len(byKey))
	}
	t.Logf("%d messages, %d replays, %d transactions", len(stored), replayed,
		e.count(t, `SELECT count(DISTINCT xmin::text) FROM consumers.messages`))
}

// TestLockedChatDoesNotHoldBackOthers: while another session holds chat
// 71's lock, sends to chats 72, 73 and 75 are committed (the lock is still
// held when they return), and the send to chat 71 fails with ErrChatBusy
// after the lock timeout, storing nothing; once the lock is free chat 71
// numbers on from 1.
func TestLockedChatDoesNotHoldBackOthers(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t, outbox.WakeAfterCommit)
	e.store.lockTimeout = 300 * time.Millisecond
	release := e.lockChat(t, 71)
	ctx := context.Background()
	locked := e.goSend(ctx, 71, "to the locked chat")
	queuedBehind := e.goSend(ctx, 71, "queued behind it")
	for _, c := range []int64{72, 73, 75} {
		if m, err := e.store.Send(ctx, c, "elsewhere", ""); err != nil || m.Seq != 1 {
			t.Fatalf("chat %d while 71 is locked: %+v, %v", c, m, err)
		}
	}
	for _, ch := range []<-chan sendOutcome{locked, queuedBehind} {
		if o := <-ch; !errors.Is(o.err, chat.ErrChatBusy) {
			t.Fatalf("send to the locked chat: %+v, want ErrChatBusy", o)
		}
	}
	if n := e.count(t, `SELECT count(*) FROM consumers.messages WHERE chat_id = 71`); n != 0 {
		t.Fatalf("%d messages stored in the locked chat", n)
	}
	release(false)
	if m, err := e.store.Send(ctx, 71, "after", ""); err != nil || m.Seq != 1 {
		t.Fatalf("chat 71 after the lock: %+v, %v", m, err)
	}
	e.checkConsistent(t)
}

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
