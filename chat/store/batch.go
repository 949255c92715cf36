package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
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
// the NOTIFY in WakeInTx mode) and COMMIT.
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

	st, err := s.lockAndRead(ctx, conn, chats, keyChats, keys, wait, lockTimeout)
	if err != nil {
		return nil, nil, classifySendError(err)
	}

	// Number the new messages; answer replays and conflicts.
	res = make([]*sendResult, len(reqs))
	leader := map[chatKey]int{} // key → index of the batch's first send with it
	var fresh []int             // indexes of the new messages
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
			if _, ok := leader[ck]; ok {
				continue // resolved after the commit, from its leader
			}
			leader[ck] = i
		}
		id, err := uuid.NewV7()
		if err != nil {
			return nil, nil, fmt.Errorf("message id: %w", err)
		}
		st.last[r.chatID]++
		res[i] = &sendResult{m: chat.Message{ID: id.String(), ChatID: r.chatID, Seq: st.last[r.chatID], Body: r.body, SentAt: st.now, From: s.service, Author: r.author}}
		fresh = append(fresh, i)
	}

	ms, err := s.insertAndCommit(ctx, conn, reqs, res, fresh)
	if err != nil {
		return nil, nil, err
	}
	// Later sends of a key the batch stored: replays of (or conflicts with)
	// the first.
	for i, r := range reqs {
		if res[i] == nil && st.locked[r.chatID] {
			res[i] = replayOrConflict(res[leader[chatKey{r.chatID, r.key}]].m, r.body)
		}
	}
	if len(ms) > 0 {
		s.committed(ms)
		if s.afterCommit != nil {
			s.afterCommit(ms)
		}
	}
	return res, skipped, nil
}

// chatKey is an idempotency key within its chat.
type chatKey struct {
	chat int64
	key  string
}

// batchState is what the first round trip of a batch learns: the chats
// whose locks it holds, their last seqs, the messages already stored under
// the batch's idempotency keys, and the transaction's start time.
type batchState struct {
	locked map[int64]bool
	last   map[int64]int64
	stored map[chatKey]chat.Message
	now    time.Time
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
	st := &batchState{locked: make(map[int64]bool, len(chats)), last: make(map[int64]int64, len(chats)), stored: map[chatKey]chat.Message{}}
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
			if err := rows.Scan(&c, &seq, &st.now); err != nil {
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
// messages committed; on error nothing is stored.
func (s *Store) insertAndCommit(ctx context.Context, conn *pgxpool.Conn, reqs []*sendReq, res []*sendResult, fresh []int) ([]chat.Message, error) {
	b := &pgx.Batch{}
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
		b.Queue(s.q.insertMessages, ids, chatIDs, seqs, bodies, cids, authors)
		if err := s.queueEvents(b, ms, events); err != nil {
			return nil, err
		}
	}
	b.Queue("COMMIT")
	br := conn.SendBatch(ctx, b)
	var tag pgconn.CommandTag
	var err error
	for i := range b.Len() {
		if tag, err = br.Exec(); err != nil {
			break
		}
		if i == 0 && len(fresh) > 0 && tag.RowsAffected() != int64(len(fresh)) {
			err = fmt.Errorf("%d of %d messages inserted", tag.RowsAffected(), len(fresh))
			break
		}
	}
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err == nil && tag.String() != "COMMIT" {
		err = fmt.Errorf("transaction ended in %q", tag.String())
	}
	if err != nil {
		return nil, classifySendError(fmt.Errorf("insert and commit: %w", err))
	}
	return ms, nil
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
