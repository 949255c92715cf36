package chat

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxchat/outboxchat/internal/service"
	"github.com/outboxchat/outboxchat/outbox"
)

// Group commit of Store.Send.
//
// Send queues a request and waits. A committer goroutine takes everything
// queued (up to MaxSendBatch) as soon as its previous transaction finished —
// no timer: an idle committer takes a lone send at once — and runs one
// transaction for the batch, in two round trips: BEGIN with the counter
// upsert and the messages INSERT in one statement (queries.sendBatch); then
// the outbox INSERT (outbox.Writer.QueueEnqueue, one statement for all
// events, plus the NOTIFY in WakeInTx mode) with COMMIT. Two round trips
// per batch instead of five per message, one WAL flush per batch, and the
// counter rows are locked only while the batch's statements run, not while
// HTTP handlers are scheduled.

// MaxSendBatch is the most sends one group-commit transaction carries.
const MaxSendBatch = 256

// sendCommitters is the number of committer goroutines. Two transactions
// that share chats lock their counter rows in chat_id order, so any number
// is deadlock-free; one keeps batches largest (see bench_test.go).
const sendCommitters = 1

// sendBatchTimeout bounds one group-commit transaction, begin to commit. A
// taken send is committed regardless of its caller's ctx, so this is what
// bounds its wait when the database hangs.
const sendBatchTimeout = 10 * time.Second

// States of a sendReq: queued until the committer takes it or its waiter
// gives up on it, whichever CAS wins.
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
	author string // the principal's user ("" without auth)
	state  atomic.Int32
	done   chan sendResult // 1-buffered; receives exactly one result unless the waiter dropped it
}

type sendResult struct {
	m   Message
	err error
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
			r.Go(func() { s.commitLoop(r.Context(), run) })
		}
	})
}

// Stop stops the group committer gracefully: sends queued before it are
// committed, sends that arrive meanwhile run alone in their callers'
// goroutines, and it returns once the committer has exited. If ctx ends
// first, in-flight and queued sends are aborted (their callers get the
// error; nothing of theirs is stored), Stop waits for the committer to
// exit, and returns ctx's error wrapped. Idempotent; nil if not running.
// Start may be called again afterwards.
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
// ctx is done. It returns nil once run is stopping and the queue is empty.
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
		n := min(len(s.queue), MaxSendBatch)
		batch := slices.Clone(s.queue[:n])
		clear(s.queue[:n])
		s.queue = s.queue[n:]
		if len(s.queue) == 0 {
			s.queue = s.queue[:0:0] // let the backing array go
		} else {
			s.cond.Signal() // another committer may take the rest
		}
		s.mu.Unlock()

		kept := batch[:0]
		for _, r := range batch {
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
		if len(kept) > 0 {
			return kept
		}
	}
}

// commitLoop is one committer: take a batch, commit it, answer its senders.
func (s *Store) commitLoop(ctx context.Context, run *storeRun) {
	for {
		batch := s.take(run)
		if batch == nil {
			return
		}
		tctx, cancel := context.WithTimeout(ctx, sendBatchTimeout)
		ms, err := s.commitBatch(tctx, batch)
		cancel()
		for i, r := range batch {
			if err != nil {
				r.done <- sendResult{err: fmt.Errorf("send: %w", err)}
			} else {
				r.done <- sendResult{m: ms[i]}
			}
		}
	}
}

// commitBatch stores reqs' messages and outbox events in one transaction
// under ctx and returns the messages in reqs' order. Per chat, reqs take
// consecutive seqs in their order. After the commit it calls
// writer.Committed and afterCommit once. On error
// nothing is stored.
func (s *Store) commitBatch(ctx context.Context, reqs []*sendReq) ([]Message, error) {
	counts := make(map[int64]int64, len(reqs))
	ms := make([]Message, len(reqs))
	for i, r := range reqs {
		id, err := uuid.NewV7()
		if err != nil {
			return nil, fmt.Errorf("message id: %w", err)
		}
		counts[r.chatID]++
		// Seq holds the rank within the chat until the counter is known.
		ms[i] = Message{ID: id.String(), ChatID: r.chatID, Seq: counts[r.chatID], Body: r.body, From: s.service, Author: r.author}
	}
	chats := slices.Sorted(maps.Keys(counts))
	ns := make([]int64, len(chats))
	for i, c := range chats {
		ns[i] = counts[c]
	}
	ids := make([]string, len(ms))
	chatIDs := make([]int64, len(ms))
	backs := make([]int64, len(ms))
	bodies := make([]string, len(ms))
	authors := make([]string, len(ms))
	for i, m := range ms {
		ids[i], chatIDs[i], backs[i], bodies[i], authors[i] = m.ID, m.ChatID, counts[m.ChatID]-m.Seq, m.Body, m.Author
	}

	// Two round trips for the whole batch: BEGIN with the numbering and
	// insert statement, then the outbox insert with COMMIT (the events need
	// the seqs and the time the first one returns).
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquire connection: %w", err)
	}
	// Release destroys a connection left inside a transaction (any error
	// below): that rolls the batch back.
	defer conn.Release()
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(s.q.sendBatch, chats, ns, ids, chatIDs, backs, bodies, authors)
	br := conn.SendBatch(ctx, b)
	last := make(map[int64]int64, len(chats))
	var (
		now      time.Time
		inserted int64
	)
	err = func() error {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("begin: %w", err)
		}
		rows, err := br.Query()
		if err != nil {
			return fmt.Errorf("number and insert messages: %w", err)
		}
		for rows.Next() {
			var chat, seq int64
			if err := rows.Scan(&chat, &seq, &now, &inserted); err != nil {
				rows.Close()
				return fmt.Errorf("number and insert messages: %w", err)
			}
			last[chat] = seq
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("number and insert messages: %w", err)
		}
		return nil
	}()
	if cerr := br.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("number and insert messages: %w", cerr)
	}
	if err != nil {
		return nil, err
	}
	if len(last) != len(chats) || inserted != int64(len(ms)) {
		return nil, fmt.Errorf("number and insert messages: %d of %d chats numbered, %d of %d messages inserted",
			len(last), len(chats), inserted, len(ms))
	}
	events := make([]outbox.Event, len(ms))
	for i := range ms {
		m := &ms[i]
		m.Seq = last[m.ChatID] - (counts[m.ChatID] - m.Seq)
		m.SentAt = now
		payload, err := json.Marshal(*m)
		if err != nil {
			return nil, fmt.Errorf("encode event: %w", err)
		}
		// Request order: each chat's events, hence its outbox ids, ascend
		// with seq (invariant 5).
		events[i] = outbox.Event{ID: m.ID, Name: EventMessageCreated, Payload: payload}
	}
	b = &pgx.Batch{}
	n, err := s.writer.QueueEnqueue(b, events...)
	if err != nil {
		return nil, err
	}
	b.Queue("COMMIT")
	br = conn.SendBatch(ctx, b)
	var tag pgconn.CommandTag
	for range n + 1 {
		if tag, err = br.Exec(); err != nil {
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
		return nil, fmt.Errorf("enqueue and commit: %w", err)
	}
	s.writer.Committed()
	if s.afterCommit != nil {
		s.afterCommit(ms)
	}
	return ms, nil
}
