package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxchat/outboxchat/chat"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/internal/service"
	"github.com/outboxchat/outboxchat/outbox"
)

// Group commit of Store.Send, and how a chat's seq is allocated.
//
// Numbering. A chat's seq is not kept in a counter row (every send would
// update the same row; with the xmin horizon held back by an old snapshot
// those dead versions pile up and every update walks them).
// Instead the send transaction takes the chat's advisory transaction lock
// (pg_try_advisory_xact_lock / pg_advisory_xact_lock of ChatLockSQL's key)
// and then, in a later statement and so with a snapshot taken after the
// lock was granted, reads max(seq) of the chat from the (chat_id, seq)
// unique index (one backward index step: messages are insert-only, so no
// dead entries accumulate there), and numbers above the chat's newest seq
// floor too, so that deleted rows never let a seq be handed out again
// (migration 008; queries.lastSeqs). The lock is released only after the
// holder's commit is visible to new snapshots, so the next holder numbers
// on from it: seq is gap-free and equals commit order per chat (invariant
// 5), and a transaction's outbox ids, taken while it holds the lock, exceed
// those of every earlier transaction of the chat. The lock writes nothing.
//
// Group commit. Send queues a request and waits. A committer goroutine
// takes everything queued (up to MaxSendBatch) as soon as its previous
// transaction finished — no timer: an idle committer takes a lone send at
// once — and runs one transaction for the batch in two round trips: BEGIN,
// the transaction-local timeouts, the try-lock of every chat of the batch,
// the chats' max(seq) and the lookup of the batch's idempotency keys; then
// the messages INSERT, the outbox INSERT (outbox.Writer.QueueEnqueue, plus
// the NOTIFY in WakeInTx mode) and COMMIT. When the committer already knows
// every chat's last seq (its seq hints, below), the batch is numbered from
// them and sent in one round trip, checked under the locks.
//
// Isolation between chats. The committer never waits for a chat's lock: a
// chat whose lock another session holds (try-lock false) is left out of
// the batch, and its sends move to that chat's slow lane: a goroutine that
// commits the chat's sends in transactions of their own, waiting for the
// lock at most the lock timeout (lock_timeout; then every send it holds
// fails with chat.ErrChatBusy and nothing of theirs is stored). While a chat has
// a slow lane, its new sends queue there too, so a chat's sends keep their
// queue order. At most slowLanes slow lanes hold a connection at a time.
// Everything else a transaction might wait for is bounded by the same
// lock_timeout and by statement_timeout (sendStatementTimeout).
//
// Idempotency. A send may carry a key (the client's Idempotency-Key or
// client_id). Under the chat's lock, the batch looks its keys up in the
// messages table (unique index (chat_id, client_id)): a key already stored
// answers with the stored message (replayed) if the body is the same, and
// with chat.ErrIdempotencyConflict if not; two sends of one batch with the same
// chat and key store one message. The key is stored with the message in
// the same transaction, so a retry after an unknown outcome either finds
// it or stores it; the unique index is the backstop.

// MaxSendBatch is the most sends one group-commit transaction carries.
const MaxSendBatch = 256

// sendCommitters is the number of committer goroutines. The committer
// only try-locks chats, so any number is deadlock-free; one keeps batches
// largest (see bench_test.go).
const sendCommitters = 1

// sendBatchTimeout bounds one send transaction, begin to commit (its ctx).
// A taken send is committed regardless of its caller's ctx, so this, with
// sendStatementTimeout and the lock timeout, is what bounds its wait when
// the database hangs.
const sendBatchTimeout = 10 * time.Second

// sendStatementTimeout is the send transactions' statement_timeout.
const sendStatementTimeout = 5 * time.Second

// DefaultSendLockTimeout is how long a send waits for its chat's lock
// (Config.SendLockTimeout) before it fails with chat.ErrChatBusy.
const DefaultSendLockTimeout = 2 * time.Second

// States of a sendReq: queued until a transaction takes it or its waiter
// gives up on it, whichever CAS wins. A send the committer moves to a slow
// lane is queued again.
const (
	reqQueued int32 = iota
	reqTaken
	reqDropped
)

// sendReq is one queued Send.
type sendReq struct {
	ctx    context.Context // the caller's: checked when taken, never used for the transaction
	chatID int64
	body   string
	key    string // idempotency key; "" = none
	author string // the principal's user ("" without auth)
	queued time.Time
	state  atomic.Int32
	done   chan sendResult // 1-buffered; receives exactly one result unless the waiter dropped it
}

type sendResult struct {
	m        chat.Message
	replayed bool // an earlier send with the same key stored m
	err      error
}

// slowChat is one chat's slow lane: its sends waiting for the lock.
type slowChat struct {
	queue []*sendReq // guarded by Store.mu
}

// storeRun is one run of a Store's committers.
type storeRun struct {
	stopping bool // guarded by Store.mu: take no more sends, drain the queue, exit
}

// Start starts the group committer and returns at once. From then on Send
// queues its message for the committer instead of running its own
// transaction. It follows the contract of internal/service: the committer
// runs until Stop, or until ctx is cancelled, which is a hard stop (the
// in-flight transaction and the queued sends are aborted, their callers get
// the error, nothing of theirs is stored; later sends run alone in their
// callers' goroutines). It returns an error wrapping
// outbox.ErrAlreadyStarted if the Store is running or still stopping, or
// ctx.Err() if ctx is already done. Start and Stop may be called
// concurrently with Send and with each other.
func (s *Store) Start(ctx context.Context) error {
	return s.life.Start(ctx, func(r *service.Run) {
		run := &storeRun{}
		s.mu.Lock()
		s.run = run
		s.mu.Unlock()
		// Stop (or a hard stop) wakes the committers waiting for sends.
		r.Go(func() {
			select {
			case <-r.Stopping():
			case <-r.Context().Done():
			}
			s.beginStop(run)
		})
		for range sendCommitters {
			r.Go(func() { s.commitLoop(r, run) })
		}
	})
}

// Stop stops the group committer gracefully: sends queued before it are
// committed, sends that arrive meanwhile run alone in their callers'
// goroutines, and it returns once the committer and the slow lanes have
// exited. If ctx ends first, in-flight and queued sends are aborted (their
// callers get the error; nothing of theirs is stored, except that a
// transaction whose COMMIT was already sent, pipelined behind its inserts,
// may still commit: its callers' outcome is unknown, which a retry with the
// same idempotency key resolves), Stop waits for the goroutines to exit,
// and returns ctx's error wrapped. Idempotent; nil if not running. Start
// may be called again afterwards.
func (s *Store) Stop(ctx context.Context) error {
	return s.life.Stop(ctx)
}

// Started returns a channel closed once the latest Start succeeded.
func (s *Store) Started() <-chan struct{} { return s.life.Started() }

// Stopped returns a channel closed once the latest run's committers have
// exited (closed before the first Start).
func (s *Store) Stopped() <-chan struct{} { return s.life.Stopped() }

func (s *Store) beginStop(run *storeRun) {
	s.mu.Lock()
	run.stopping = true
	s.cond.Broadcast()
	s.mu.Unlock()
}

// enqueue queues r for the committer and reports whether it did: false when
// the Store is not started or is stopping.
func (s *Store) enqueue(r *sendReq) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.run == nil || s.run.stopping {
		return false
	}
	s.queue = append(s.queue, r)
	s.cond.Signal()
	return true
}

// take waits for queued sends and takes up to MaxSendBatch of them, in queue
// order, skipping those whose waiter has given up and answering those whose
// ctx is done; a send of a chat that has a slow lane joins that lane
// instead. It returns nil once run is stopping and the queue is empty.
func (s *Store) take(run *storeRun) []*sendReq {
	for {
		s.mu.Lock()
		for len(s.queue) == 0 && !run.stopping {
			s.cond.Wait()
		}
		if len(s.queue) == 0 {
			s.mu.Unlock()
			return nil
		}
		var batch []*sendReq
		i := 0
		for ; i < len(s.queue) && len(batch) < MaxSendBatch; i++ {
			r := s.queue[i]
			if sc := s.slow[r.chatID]; sc != nil {
				sc.queue = append(sc.queue, r)
				continue
			}
			batch = append(batch, r)
		}
		clear(s.queue[:i])
		s.queue = s.queue[i:]
		if len(s.queue) == 0 {
			s.queue = s.queue[:0:0] // let the backing array go
		} else {
			s.cond.Signal() // another committer may take the rest
		}
		s.mu.Unlock()
		if kept := claimReqs(batch); len(kept) > 0 {
			return kept
		}
	}
}

// claimReqs marks reqs taken and returns them, but for those whose waiter
// gave up (dropped) or whose ctx is done (answered with its error).
func claimReqs(reqs []*sendReq) []*sendReq {
	kept := reqs[:0]
	for _, r := range reqs {
		if err := r.ctx.Err(); err != nil {
			if r.state.CompareAndSwap(reqQueued, reqDropped) {
				r.done <- sendResult{err: fmt.Errorf("send: %w", err)}
			}
			continue
		}
		if r.state.CompareAndSwap(reqQueued, reqTaken) {
			kept = append(kept, r)
		}
	}
	return kept
}

// commitLoop is one committer: take a batch, commit it, answer its senders,
// hand the sends of chats it could not lock to their slow lanes.
func (s *Store) commitLoop(r *service.Run, run *storeRun) {
	ctx := r.Context()
	for {
		batch := s.take(run)
		if batch == nil {
			return
		}
		tctx, cancel := context.WithTimeout(ctx, sendBatchTimeout)
		res, skipped, err := s.commitBatch(tctx, batch, false, s.lockTimeout)
		cancel()
		if err == nil && len(skipped) > 0 {
			s.toSlowLanes(r, skipped)
		}
		answer(batch, res, err)
	}
}

// answer sends each req its result, or err; reqs with a nil result slot
// (moved to a slow lane) are skipped.
func answer(reqs []*sendReq, res []*sendResult, err error) {
	for i, r := range reqs {
		switch {
		case err != nil:
			r.done <- sendResult{err: fmt.Errorf("send: %w", err)}
		case res[i] != nil:
			r.done <- *res[i]
		}
	}
}

// toSlowLanes queues reqs (in order) in their chats' slow lanes, starting
// the lanes that do not run yet. Each req is queued again, so its waiter
// may still give up on it.
func (s *Store) toSlowLanes(run *service.Run, reqs []*sendReq) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range reqs {
		r.state.Store(reqQueued)
		sc := s.slow[r.chatID]
		if sc == nil {
			sc = &slowChat{}
			if s.slow == nil {
				s.slow = map[int64]*slowChat{}
			}
			s.slow[r.chatID] = sc
			chat := r.chatID
			run.Go(func() { s.slowLane(run.Context(), chat, sc) })
		}
		sc.queue = append(sc.queue, r)
	}
}

// slowLane commits chat's queued sends, waiting for the chat's lock at most
// the lock timeout per transaction, until its queue is empty; then the chat
// goes back to the group commit.
func (s *Store) slowLane(ctx context.Context, chatID int64, sc *slowChat) {
	for {
		s.mu.Lock()
		n := min(len(sc.queue), MaxSendBatch)
		if n == 0 {
			delete(s.slow, chatID)
			s.mu.Unlock()
			return
		}
		reqs := slices.Clone(sc.queue[:n])
		clear(sc.queue[:n])
		sc.queue = sc.queue[n:]
		s.mu.Unlock()
		reqs = claimReqs(reqs)
		if len(reqs) == 0 {
			continue
		}
		// Each send waits for the lock at most the lock timeout from when
		// it was queued: the transaction's lock_timeout is what is left of
		// the oldest's (earlier attempts and a wait for a free slow lane
		// count against it).
		left := s.lockTimeout - time.Since(reqs[0].queued)
		if left <= 0 {
			answer(reqs, nil, chat.ErrChatBusy)
			continue
		}
		t := time.NewTimer(left)
		select {
		case s.slowSem <- struct{}{}:
			t.Stop()
		case <-t.C:
			answer(reqs, nil, fmt.Errorf("%w (waited for a free slow lane)", chat.ErrChatBusy))
			continue
		case <-ctx.Done():
			t.Stop()
			answer(reqs, nil, ctx.Err())
			continue
		}
		left = max(s.lockTimeout-time.Since(reqs[0].queued), time.Millisecond)
		tctx, cancel := context.WithTimeout(ctx, sendBatchTimeout)
		res, _, err := s.commitBatch(tctx, reqs, true, left)
		cancel()
		<-s.slowSem
		answer(reqs, res, err)
	}
}

// commitBatch stores reqs' new messages and their outbox events in one
// transaction under ctx, with lockTimeout as its lock_timeout. With wait
// false it only try-locks the chats and returns the reqs of chats it could
// not lock in skipped (their result slots nil, nothing of theirs done);
// with wait true reqs must all be of one chat, whose lock it waits for (at
// most lockTimeout, then chat.ErrChatBusy).
// Per chat, the new messages take consecutive seqs in reqs' order. After the
// commit it calls writer.Committed and afterCommit once (new messages only).
// On error nothing is stored.
//
// With wait false and every chat of the batch in the seq hints, it first
// tries the batch in one round trip, numbered from the hints and checked
// under the locks (commitHinted); when that check or an idempotency key
// already stored rolls it back, it rolls back and runs the two round trips
// on the same connection.
func (s *Store) commitBatch(ctx context.Context, reqs []*sendReq, wait bool, lockTimeout time.Duration) (res []*sendResult, skipped []*sendReq, err error) {
	if s.onBatch != nil {
		began := time.Now()
		defer func() { s.reportBatch(reqs, skipped, began, err) }()
	}
	chatSet := make(map[int64]bool, len(reqs))
	keySet := map[chatKey]bool{}
	var keyChats []int64
	var keys []string
	for _, r := range reqs {
		chatSet[r.chatID] = true
		if ck := (chatKey{r.chatID, r.key}); r.key != "" && !keySet[ck] {
			keySet[ck] = true
			keyChats, keys = append(keyChats, r.chatID), append(keys, r.key)
		}
	}
	chats := slices.Sorted(maps.Keys(chatSet))
	if wait && len(chats) != 1 {
		return nil, nil, fmt.Errorf("chat: commitBatch waits for one chat's lock, not %d", len(chats))
	}

	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, classifySendError(fmt.Errorf("acquire connection: %w", err))
	}
	// Release destroys a connection left inside a transaction (any error
	// below): that rolls the batch back.
	defer conn.Release()

	var hinted map[int64]int64
	if !wait {
		hinted = s.hints.lookup(chats)
	}
	if hinted != nil {
		res, err := s.commitHinted(ctx, conn, reqs, chats, maps.Clone(hinted))
		if err == nil {
			return res, nil, nil
		}
		if !errors.Is(err, errHintedRolledBack) {
			s.hints.forget(chats)
			return nil, nil, err
		}
		// A simple-protocol ROLLBACK of its own: pgx prepares a batch's new
		// statements in a round trip before the batch, which an aborted
		// transaction would refuse.
		if _, err := conn.Conn().PgConn().Exec(ctx, "ROLLBACK").ReadAll(); err != nil {
			return nil, nil, classifySendError(fmt.Errorf("roll back the hinted batch: %w", err))
		}
	}

	st, err := s.lockAndRead(ctx, conn, chats, keyChats, keys, wait, lockTimeout)
	if err != nil {
		s.hints.forget(chats)
		return nil, nil, classifySendError(err)
	}
	stale := staleHints(hinted, st.last)
	res, skipped, fresh, err := s.number(reqs, st)
	if err != nil {
		return nil, nil, err
	}
	ms, err := s.insertAndCommit(ctx, conn, reqs, res, fresh, nil)
	if err != nil {
		s.hints.forget(chats)
		return nil, nil, err
	}
	s.hints.learn(st, stale)
	s.finish(reqs, res, st, ms)
	return res, skipped, nil
}

// errHintedRolledBack is commitHinted's error when Postgres refused the
// batch before its COMMIT (a seq hint was stale, a chat's lock was taken,
// or an idempotency key or seq was already stored): the transaction is
// aborted, nothing of it is stored, and the connection is still usable
// once it is rolled back.
var errHintedRolledBack = errors.New("chat: hinted batch rolled back")

// commitHinted commits reqs (every chat of which is free to lock and
// numbered from last, the seq hints) in one round trip: BEGIN, the
// timeouts, the try-locks, the messages INSERT checked under the locks
// (queries.insertMessagesChecked), the outbox INSERT and COMMIT. It returns
// the results of every req, or an error wrapping errHintedRolledBack when
// the check failed or a unique index refused a row (then nothing is stored
// and the caller runs the two round trips), or another error, as
// insertAndCommit does.
func (s *Store) commitHinted(ctx context.Context, conn *pgxpool.Conn, reqs []*sendReq, chats []int64, last map[int64]int64) ([]*sendResult, error) {
	st := &batchState{locked: make(map[int64]bool, len(chats)), last: last, stored: map[chatKey]chat.Message{}, now: sendClock()}
	expect := make([]int64, len(chats))
	for i, c := range chats {
		st.locked[c] = true
		expect[i] = last[c]
	}
	res, _, fresh, err := s.number(reqs, st)
	if err != nil {
		return nil, err
	}
	ms, err := s.insertAndCommit(ctx, conn, reqs, res, fresh, &hintCheck{chats: chats, last: expect})
	if err != nil {
		return nil, err
	}
	s.hints.learn(st, nil)
	s.hints.hits.Add(1)
	s.finish(reqs, res, st, ms)
	return res, nil
}

// number numbers the new messages of reqs from st (each chat's from its
// last seq on, in reqs' order), answers replays and conflicts with the
// messages st found stored under their keys, and returns the results (nil
// for the reqs of chats not locked, returned in skipped, and for later
// sends of a key the batch stores, resolved by finish), and the indexes of
// the new messages.
func (s *Store) number(reqs []*sendReq, st *batchState) (res []*sendResult, skipped []*sendReq, fresh []int, err error) {
	res = make([]*sendResult, len(reqs))
	st.leader = map[chatKey]int{}
	for i, r := range reqs {
		if !st.locked[r.chatID] {
			skipped = append(skipped, r)
			continue
		}
		ck := chatKey{r.chatID, r.key}
		if r.key != "" {
			if m, ok := st.stored[ck]; ok {
				res[i] = replayOrConflict(m, r.body)
				continue
			}
			if _, ok := st.leader[ck]; ok {
				continue // resolved after the commit, from its leader
			}
			st.leader[ck] = i
		}
		id, err := uuid.NewV7()
		if err != nil {
			return nil, nil, nil, fmt.Errorf("message id: %w", err)
		}
		st.last[r.chatID]++
		res[i] = &sendResult{m: chat.Message{ID: id.String(), ChatID: r.chatID, Seq: st.last[r.chatID], Body: r.body, SentAt: st.now, From: s.service, Author: r.author}}
		fresh = append(fresh, i)
	}
	return res, skipped, fresh, nil
}

// finish completes a committed batch: later sends of a key the batch
// stored become replays of (or conflicts with) the first, and the relays
// and afterCommit learn of the new messages ms.
func (s *Store) finish(reqs []*sendReq, res []*sendResult, st *batchState, ms []chat.Message) {
	for i, r := range reqs {
		if res[i] == nil && st.locked[r.chatID] {
			res[i] = replayOrConflict(res[st.leader[chatKey{r.chatID, r.key}]].m, r.body)
		}
	}
	if len(ms) > 0 {
		s.committed(ms)
		if s.afterCommit != nil {
			s.afterCommit(ms)
		}
	}
}

// sendClock is a send batch's sent_at: the service's clock when the batch
// is numbered, to the microsecond Postgres keeps, in UTC.
func sendClock() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }

// chatKey is an idempotency key within its chat.
type chatKey struct {
	chat int64
	key  string
}

// batchState is what numbering a batch starts from: the chats whose
// locks it holds, their last seqs (advanced by number to the batch's
// last), the messages already stored under the batch's idempotency keys,
// and the batch's sent_at; number adds, per key, the index of the batch's
// first send with it.
type batchState struct {
	locked map[int64]bool
	last   map[int64]int64
	stored map[chatKey]chat.Message
	now    time.Time
	leader map[chatKey]int
}

// lockAndRead is a batch's first round trip: BEGIN, timeouts, the chats'
// locks (waiting for the one chat's, or taking those that are free), then
// (new statements, so new snapshots taken after the locks were granted)
// the chats' last seqs and the keys already stored.
func (s *Store) lockAndRead(ctx context.Context, conn *pgxpool.Conn, chats, keyChats []int64, keys []string, wait bool, lockTimeout time.Duration) (*batchState, error) {
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(setSendTimeoutsSQL, pgMillis(lockTimeout), pgMillis(sendStatementTimeout))
	if wait {
		b.Queue(s.q.lockChat, chats[0])
	} else {
		b.Queue(s.q.tryLockChats, chats)
	}
	b.Queue(s.q.lastSeqs, chats)
	if len(keys) > 0 {
		b.Queue(s.q.findKeys, keyChats, keys)
	}
	st := &batchState{locked: make(map[int64]bool, len(chats)), last: make(map[int64]int64, len(chats)), stored: map[chatKey]chat.Message{}, now: sendClock()}
	br := conn.SendBatch(ctx, b)
	err := func() error {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("begin: %w", err)
		}
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("set timeouts: %w", err)
		}
		if wait {
			if _, err := br.Exec(); err != nil {
				return fmt.Errorf("lock chat %d: %w", chats[0], err)
			}
			st.locked[chats[0]] = true
		} else {
			rows, _ := br.Query()
			got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			if err != nil {
				return fmt.Errorf("lock chats: %w", err)
			}
			for _, c := range got {
				st.locked[c] = true
			}
		}
		rows, _ := br.Query()
		for rows.Next() {
			var c, seq int64
			if err := rows.Scan(&c, &seq); err != nil {
				rows.Close()
				return fmt.Errorf("read last seqs: %w", err)
			}
			st.last[c] = seq
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("read last seqs: %w", err)
		}
		if len(keys) == 0 {
			return nil
		}
		rows, _ = br.Query()
		for rows.Next() {
			var ck chatKey
			m := chat.Message{From: s.service}
			if err := rows.Scan(&ck.chat, &ck.key, &m.ID, &m.Seq, &m.Body, &m.SentAt, &m.Author); err != nil {
				rows.Close()
				return fmt.Errorf("look up idempotency keys: %w", err)
			}
			m.ChatID = ck.chat
			st.stored[ck] = m
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("look up idempotency keys: %w", err)
		}
		return nil
	}()
	if cerr := br.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("lock and number: %w", cerr)
	}
	if err != nil {
		return nil, err
	}
	return st, nil
}

// reportBatch calls onBatch with the contexts of the sends of reqs that
// the transaction answered: all but those skipped for a later one.
func (s *Store) reportBatch(reqs, skipped []*sendReq, began time.Time, err error) {
	ctxs := make([]context.Context, 0, len(reqs))
	for _, r := range reqs {
		if !slices.Contains(skipped, r) {
			ctxs = append(ctxs, r.ctx)
		}
	}
	s.onBatch(ctxs, began, err)
}

// insertAndCommit is a batch's second round trip: the new messages
// (res[i] for i in fresh), their outbox events, COMMIT. It returns the
// messages committed; on error nothing is stored. With check set it is the
// batch's only round trip: BEGIN, the timeouts and the try-locks come
// first, and the messages INSERT fails unless check holds
// (queries.insertMessagesChecked); a failure Postgres reports before the
// COMMIT then wraps errHintedRolledBack.
func (s *Store) insertAndCommit(ctx context.Context, conn *pgxpool.Conn, reqs []*sendReq, res []*sendResult, fresh []int, check *hintCheck) ([]chat.Message, error) {
	b := &pgx.Batch{}
	lead := 0 // statements before the messages INSERT
	if check != nil {
		b.Queue("BEGIN")
		b.Queue(setSendTimeoutsSQL, pgMillis(s.lockTimeout), pgMillis(sendStatementTimeout))
		b.Queue(s.q.tryLockChatsCounted, check.chats)
		lead = 3
	}
	var ms []chat.Message
	if len(fresh) > 0 {
		ms = make([]chat.Message, len(fresh))
		ids := make([]string, len(fresh))
		chatIDs := make([]int64, len(fresh))
		seqs := make([]int64, len(fresh))
		bodies := make([]string, len(fresh))
		cids := make([]string, len(fresh))
		authors := make([]string, len(fresh))
		events := make([]outbox.Event, len(fresh))
		for j, i := range fresh {
			m := res[i].m
			ms[j] = m
			ids[j], chatIDs[j], seqs[j], bodies[j], cids[j], authors[j] = m.ID, m.ChatID, m.Seq, m.Body, reqs[i].key, m.Author
			payload, err := m.EventJSON()
			if err != nil {
				return nil, fmt.Errorf("encode event: %w", err)
			}
			// Request order: each chat's events, hence its outbox ids, ascend
			// with seq (invariant 5).
			events[j] = outbox.Event{ID: m.ID, Name: chat.EventMessageCreated, Payload: payload}
			if s.headers != nil {
				events[j].Headers = s.headers(reqs[i].ctx)
			}
		}
		at := res[fresh[0]].m.SentAt
		if check != nil {
			b.Queue(s.q.insertMessagesChecked, ids, chatIDs, seqs, bodies, cids, authors, at, check.chats, check.last)
		} else {
			b.Queue(s.q.insertMessages, ids, chatIDs, seqs, bodies, cids, authors, at)
		}
		if err := s.queueEvents(b, ms, events); err != nil {
			return nil, err
		}
	}
	b.Queue("COMMIT")
	br := conn.SendBatch(ctx, b)
	var tag pgconn.CommandTag
	var err error
	failedAt := -1
	committed := false // COMMIT's own answer came back: whatever follows, the batch is stored
	for i := range b.Len() {
		if tag, err = br.Exec(); err != nil {
			failedAt = i
			break
		}
		if i == lead && len(fresh) > 0 && tag.RowsAffected() != int64(len(fresh)) {
			err = fmt.Errorf("%d of %d messages inserted", tag.RowsAffected(), len(fresh))
			break
		}
		committed = i == b.Len()-1 && tag.String() == "COMMIT"
	}
	// Close reads the ReadyForQuery after COMMIT's answer; a connection
	// lost there (a terminated backend, a cut) loses nothing of the batch.
	if cerr := br.Close(); err == nil && cerr != nil && !committed {
		err = cerr
	}
	if err == nil && tag.String() != "COMMIT" {
		err = fmt.Errorf("transaction ended in %q", tag.String())
	}
	if err != nil {
		var pgErr *pgconn.PgError
		if check != nil && failedAt >= lead && failedAt < b.Len()-1 && errors.As(err, &pgErr) && hintRefused(pgErr) {
			return nil, fmt.Errorf("%w: %w", errHintedRolledBack, err)
		}
		err = classifySendError(fmt.Errorf("insert and commit: %w", err))
		if len(ms) == 0 || !outcomeUnknown(err) {
			return nil, err
		}
		stored, oerr := s.outcomeOf(ctx, ms[0])
		outcome := "not_stored" // it held the lock from its first round trip: rolled back
		switch {
		case oerr != nil:
			err = fmt.Errorf("%w: %w (and reading the outcome: %w)", chat.ErrSendOutcomeUnknown, err, oerr)
			outcome = "unknown"
		case !stored && check != nil:
			// A one-round-trip batch takes its locks in its pipeline: one
			// its server has yet to read (a backend stalled, the client's
			// deadline passed) could still take them and commit after
			// this read. Only a stored message decides it.
			err = fmt.Errorf("%w: %w (not stored when read)", chat.ErrSendOutcomeUnknown, err)
			outcome = "unknown"
		case stored:
			outcome = "stored"
		}
		s.commitAnswerLost(outcome, len(ms), err)
		if outcome != "stored" {
			return nil, err
		}
		// Stored: the sends are answered as such, as if the answer had come.
	}
	return ms, nil
}

// commitAnswerLost reports a send transaction of n new messages whose
// COMMIT answer was lost (err) and the outcome read after it.
func (s *Store) commitAnswerLost(outcome string, n int, err error) {
	s.log.Warn("send transaction: COMMIT's answer lost; outcome read on another connection",
		"outcome", outcome, "messages", n, "err", err)
	if m := s.metrics; m != nil && m.CommitAnswerLost != nil {
		m.CommitAnswerLost(outcome)
	}
}

// outcomeUnknown reports whether a send batch that failed with err, its
// COMMIT sent, may have committed all the same: unless Postgres refused a
// statement (an ERROR: the transaction is aborted, and the COMMIT queued
// behind it rolls back) or pgx sent nothing (SafeToRetry), the answer was
// lost on the way: a connection cut, a FATAL (a terminated backend), a
// deadline while reading.
func outcomeUnknown(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Severity == "ERROR" {
		return false
	}
	return !pgconn.SafeToRetry(err)
}

// outcomeTimeout bounds outcomeOf.
const outcomeTimeout = 5 * time.Second

// outcomeReads is how many times outcomeOf tries to read.
const outcomeReads = 2

// outcomeOf tells whether the batch that m (one of its new messages) was
// sent in is stored, after that batch's connection failed with its outcome
// unknown: on another connection, under m's chat's lock. A two-round-trip
// batch held that lock from its first round trip, so its transaction has
// ended when the lock is granted, and a read in the next statement sees its
// commit if there was one. A one-round-trip batch may not have tried the
// lock yet: then "not stored" is not final (insertAndCommit says unknown).
// A read whose connection fails before it has read is made again once,
// on a new connection; one that Postgres refuses (the lock timeout) is
// not. Each read waits at most the lock timeout for the lock, and all of
// them outcomeTimeout, on a context that ctx's end does not cancel (the
// batch's deadline may be what failed it).
func (s *Store) outcomeOf(ctx context.Context, m chat.Message) (stored bool, err error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), outcomeTimeout)
	defer cancel()
	for range outcomeReads {
		stored, err = s.readOutcome(ctx, m)
		var pgErr *pgconn.PgError
		if err == nil || ctx.Err() != nil || errors.As(err, &pgErr) {
			break // read, out of time, or refused by Postgres (the lock timeout): not a lost connection
		}
	}
	return stored, err
}

// readOutcome is one outcomeOf read, in one round trip as lockAndRead's:
// BEGIN, the timeouts, the chat's lock, then (a new statement, so a
// snapshot taken after the lock was granted) the message's row. Its answer
// stands once the read has returned, whatever ends its transaction (which
// writes nothing, and is rolled back): the lock was held when it read.
func (s *Store) readOutcome(ctx context.Context, m chat.Message) (stored bool, err error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	// A connection left in a transaction (the ROLLBACK failed) is
	// destroyed on release, not reused.
	defer conn.Release()
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(setSendTimeoutsSQL, pgMillis(s.lockTimeout), pgMillis(sendStatementTimeout))
	b.Queue(s.q.lockChat, m.ChatID)
	b.Queue(s.q.messageStored, m.ID)
	br := conn.SendBatch(ctx, b)
	for range b.Len() - 1 {
		if _, err = br.Exec(); err != nil {
			break
		}
	}
	if err == nil {
		err = br.QueryRow().Scan(&stored)
	}
	_ = br.Close() // after the read, a lost connection changes nothing
	_, _ = conn.Exec(ctx, "ROLLBACK")
	return stored, err
}

// replayOrConflict answers a send whose key already stored m: m itself
// (replayed) if the bodies match, else chat.ErrIdempotencyConflict.
func replayOrConflict(m chat.Message, body string) *sendResult {
	if m.Body != body {
		return &sendResult{err: fmt.Errorf("send: %w (message %s, seq %d)", chat.ErrIdempotencyConflict, m.ID, m.Seq)}
	}
	return &sendResult{m: m, replayed: true}
}

// setSendTimeoutsSQL applies the send transaction's lock_timeout and
// statement_timeout ($1, $2), for this transaction only.
const setSendTimeoutsSQL = "SELECT set_config('lock_timeout', $1, true), set_config('statement_timeout', $2, true)"

// pgMillis renders d as a PostgreSQL duration setting in whole milliseconds
// (at least 1 ms; 0 would mean "no timeout").
func pgMillis(d time.Duration) string {
	return strconv.FormatInt(max(d.Milliseconds(), 1), 10) + "ms"
}

// classifySendError wraps err with chat.ErrChatBusy (lock_timeout, SQLSTATE
// 55P03) or chat.ErrSendTimeout (statement_timeout, 57014, or the
// transaction's deadline), so callers can tell them apart.
func classifySendError(err error) error {
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "55P03":
		return fmt.Errorf("%w: %w", chat.ErrChatBusy, err)
	case errors.As(err, &pgErr) && pgErr.Code == "57014", errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: %w", chat.ErrSendTimeout, err)
	}
	return err
}

// queueEvents queues the outbox INSERT of events (events[i] of ms[i]): one
// INSERT into the single outbox, or, with partitions, one per partition
// that has events, each keeping the request order of its chats' events.
func (s *Store) queueEvents(b *pgx.Batch, ms []chat.Message, events []outbox.Event) error {
	if len(s.writers) == 1 {
		_, err := s.writer.QueueEnqueue(b, events...)
		return err
	}
	parts := chat.SplitByPartition(len(s.writers), events, func(i int) int64 { return ms[i].ChatID })
	for p, evs := range parts {
		if len(evs) == 0 {
			continue
		}
		if _, err := s.writers[p].QueueEnqueue(b, evs...); err != nil {
			return err
		}
	}
	return nil
}

// committed wakes the relays of the partitions of ms after their commit
// (outbox.Writer.Committed).
func (s *Store) committed(ms []chat.Message) {
	if len(s.writers) == 1 {
		s.writer.Committed()
		return
	}
	for _, p := range chat.PartitionsOf(ms, len(s.writers)) {
		s.writers[p].Committed()
	}
}

// hintCheck is what a one-round-trip batch checks under its chats' locks:
// the try-locks took every chat, and chats[i]'s last seq is last[i].
type hintCheck struct {
	chats []int64
	last  []int64
}

// hintRefused reports whether err, from the messages INSERT of a hinted
// batch, says the batch may run again numbered from the database: the
// check failed (the INSERT's seq came out NULL: not_null_violation 23502)
// or a unique index refused a row (23505: an idempotency key already
// stored, or a seq taken). Postgres then aborted the transaction, and the
// COMMIT queued behind it was not run.
func hintRefused(err *pgconn.PgError) bool {
	return err.Code == "23505" || err.Code == "23502" && err.ColumnName == "seq"
}

// Seq hints. A batch whose chats all have a hint is numbered from the
// hints and committed in one round trip instead of two: its messages
// INSERT checks under the chats' locks that every lock was free and that
// each chat's last seq (as queries.lastSeqs reads it) is its hint, and
// fails otherwise, which rolls the whole transaction back; the batch then
// runs its two round trips on the same connection (the first begins with
// the ROLLBACK). So a hint never decides a seq: the check under the lock
// does, as the read does in the two round trips. A hint goes stale when
// something else writes the chat (another instance of the service, a slow
// lane, the v1 dual writer, a floor a receipt records); a chat found stale
// is numbered by reading for the next hintCooldown batches, so that a chat
// two instances write in turn does not pay a refused round trip per batch.
// sent_at comes from the service's clock (sendClock) in both paths, since
// the one-round-trip batch cannot read the database's before its INSERT.

// hintCooldown is how many hinted batches a chat found stale sits out.
const hintCooldown = 64

// maxSeqHints bounds the chats the hints hold; past it they are dropped
// and learnt again.
const maxSeqHints = 1 << 16

// seqHints is a Store's seq hints. Safe for concurrent use: the committer
// and the slow lanes share it.
type seqHints struct {
	mu      sync.Mutex
	last    map[int64]int64
	cool    map[int64]uint64 // chat → the batch count up to which it sits out
	batches uint64           // lookups: the committer's batches
	hits    atomic.Int64     // batches committed in one round trip (tests)
}

// lookup returns the hints of chats, or nil unless every chat has one and
// none sits out.
func (h *seqHints) lookup(chats []int64) map[int64]int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.batches++
	out := make(map[int64]int64, len(chats))
	for _, c := range chats {
		last, ok := h.last[c]
		if !ok || h.cool[c] > h.batches {
			return nil
		}
		out[c] = last
	}
	return out
}

// learn records the last seqs of st's locked chats after its batch
// committed; the chats in stale sit out the next hintCooldown batches.
func (h *seqHints) learn(st *batchState, stale []int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.last == nil || len(h.last) >= maxSeqHints {
		h.last, h.cool = map[int64]int64{}, map[int64]uint64{}
	}
	for c, ok := range st.locked {
		if ok {
			h.last[c] = st.last[c]
		}
	}
	for _, c := range stale {
		h.cool[c] = h.batches + hintCooldown
	}
}

// forget drops the hints of chats (their batch failed: its outcome may be
// unknown).
func (h *seqHints) forget(chats []int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range chats {
		delete(h.last, c)
	}
}

// staleHints returns the chats whose hint (in hinted) differs from the
// last seq read under the lock (in read).
func staleHints(hinted, read map[int64]int64) []int64 {
	var stale []int64
	for c, last := range hinted {
		if got, ok := read[c]; ok && got != last {
			stale = append(stale, c)
		}
	}
	return stale
}
