package store

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/outbox"
)

// Attack (a): a chat's seq is never handed out twice while sends run
// concurrently with hand DELETEs (a middle range, the newest row, every
// row of the chat), TRUNCATEs and prunes that cover everything. Every seq
// a send returned is unique per chat, and each goroutine's seqs of a chat
// strictly increase.
func TestAttackSeqUniqueUnderConcurrentDeletes(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t, outbox.WakeAfterCommit)
	ctx := context.Background()
	const chats, senders, perSender = 3, 6, 25
	var mu sync.Mutex
	seen := map[[2]int64]bool{}
	var dup []string
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			last := map[int64]int64{}
			for i := range perSender {
				c := int64((g+i)%chats + 1)
				m, err := e.store.Send(ctx, c, "b", "")
				if err != nil {
					t.Errorf("send: %v", err)
					return
				}
				mu.Lock()
				k := [2]int64{c, m.Seq}
				if seen[k] || m.Seq <= last[c] {
					dup = append(dup, fmt.Sprintf("chat %d seq %d (this sender's last %d)", c, m.Seq, last[c]))
				}
				seen[k] = true
				mu.Unlock()
				last[c] = m.Seq
			}
		}()
	}
	deleter := make(chan struct{})
	go func() {
		defer close(deleter)
		sts := []string{
			`DELETE FROM consumers.messages WHERE chat_id = 1 AND seq BETWEEN 2 AND (SELECT max(seq) - 1 FROM consumers.messages WHERE chat_id = 1)`,
			`DELETE FROM consumers.messages WHERE (chat_id, seq) IN (SELECT chat_id, max(seq) FROM consumers.messages GROUP BY chat_id)`,
			`DELETE FROM consumers.messages WHERE chat_id = 2`,
			`TRUNCATE consumers.messages`,
			`INSERT INTO consumers.receipts (chat_id, upto_seq, delivered_at) SELECT chat_id, max(seq), now() - interval '1 hour' FROM consumers.messages GROUP BY chat_id ON CONFLICT DO NOTHING`,
		}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := e.h.Admin.Exec(ctx, sts[i%len(sts)]); err != nil {
				t.Errorf("%s: %v", sts[i%len(sts)], err)
				return
			}
			if i%len(sts) == len(sts)-1 {
				if _, err := Prune(ctx, e.h.Admin, PruneConfig{Service: "consumers", OlderThan: time.Nanosecond, Batch: 2}); err != nil {
					t.Errorf("prune: %v", err)
					return
				}
			}
		}
	}()
	wg.Wait()
	close(stop)
	<-deleter
	if len(dup) > 0 {
		t.Fatalf("seqs handed out twice or going backwards: %v", dup)
	}
	if len(seen) != senders*perSender {
		t.Fatalf("%d distinct (chat, seq), want %d", len(seen), senders*perSender)
	}
}

// Clearing a chat's history together with the seq floors — in one
// TRUNCATE (refused: the floors may not be truncated) or with a DELETE of
// the floors after the messages (the chat's newest floor is put back) —
// does not hand seq 1 out again, and the kept receipt (upto 3) marks no new
// message delivered.
func TestAttackSeqAfterTruncatingMessagesWithFloors(t *testing.T) {
	t.Parallel()
	for _, clear := range []string{
		`TRUNCATE consumers.messages, consumers.seq_floors`,
		`DELETE FROM consumers.messages; DELETE FROM consumers.seq_floors`,
	} {
		t.Run(clear, func(t *testing.T) {
			e := newBatchEnv(t, outbox.WakeAfterCommit)
			ctx := context.Background()
			for range 3 {
				if _, err := e.store.Send(ctx, 1, "b", ""); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := e.h.Admin.Exec(ctx, `INSERT INTO consumers.receipts (chat_id, upto_seq, delivered_at) VALUES (1, 3, now())`); err != nil {
				t.Fatal(err)
			}
			if _, err := e.h.Admin.Exec(ctx, clear); err != nil && !strings.Contains(err.Error(), "holds each chat's floor") {
				t.Fatal(err) // a TRUNCATE of the floors is refused, and clears nothing
			}
			m, err := e.store.Send(ctx, 1, "new", "")
			if err != nil {
				t.Fatal(err)
			}
			delivered := e.count(t, `SELECT count(*) FROM consumers.messages_with_receipts WHERE chat_id = 1 AND seq > 3 AND delivered_at IS NOT NULL`)
			if m.Seq != 4 || delivered != 0 {
				t.Fatalf("after %q: new message got seq %d (want 4), %d new ones shown delivered (want 0)", clear, m.Seq, delivered)
			}
		})
	}
}
