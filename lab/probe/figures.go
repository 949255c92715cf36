package probe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/lab/env"
)

// Figures are the numbers a run reports, read from the database and the
// watcher, never from the lab's own bookkeeping of what it sent.
type Figures struct {
	// Saved is count(consumers.messages).
	Saved int `json:"saved"`
	// Received is the number of distinct consumers' messages the watcher
	// on workers' /ws saw.
	Received int `json:"received"`
	// DuplicatesSkipped is count(workers.inbox_duplicates).
	DuplicatesSkipped int `json:"duplicates_skipped"`
	// Lost lists the message numbers ("msg N" → N; the seq when the body
	// has no number) saved but never seen, in seq order.
	Lost []int `json:"lost"`
	// Unsent is the consumers' outbox rows with sent_at null, in every partition.
	Unsent int `json:"unsent"`
	// DuplicatesShown is the number of frames that showed a message again
	// (the scenarios' invariant; in the JSON only when not zero, so the
	// chaos object keeps DESIGN.md's five fields).
	DuplicatesShown int `json:"duplicates_shown,omitempty"`
	// OrderViolations describes frames shown out of per-chat seq order (in
	// the JSON only when there are any).
	OrderViolations []string `json:"order_violations,omitempty"`
	// Redriven is sum(consumers.messages.redrives): publishes by the
	// re-drive (in the JSON only when not zero).
	Redriven int `json:"redriven,omitempty"`
}

// MarshalJSON writes the DESIGN.md object; lost is [] (never null) when
// nothing was lost.
func (f Figures) MarshalJSON() ([]byte, error) {
	type plain Figures
	p := plain(f)
	if p.Lost == nil {
		p.Lost = []int{}
	}
	return json.Marshal(p)
}

// WriteSummary prints the three summary lines of DESIGN.md.
func (f *Figures) WriteSummary(w io.Writer) {
	fmt.Fprintf(w, "saved by consumers: %d   received by workers: %d   duplicates skipped: %d\n",
		f.Saved, f.Received, f.DuplicatesSkipped)
	if len(f.Lost) == 0 {
		fmt.Fprintln(w, "lost: none")
	} else {
		parts := make([]string, len(f.Lost))
		for i, n := range f.Lost {
			parts[i] = "msg " + strconv.Itoa(n)
		}
		fmt.Fprintln(w, "lost: "+strings.Join(parts, ", "))
	}
	fmt.Fprintf(w, "unsent in outbox: %d\n", f.Unsent)
}

// CheckInvariants returns an error describing every broken invariant:
// something lost, something shown twice, a chat's order broken.
func (f *Figures) CheckInvariants() error {
	var problems []string
	if len(f.Lost) > 0 {
		problems = append(problems, fmt.Sprintf("lost %v", f.Lost))
	}
	if f.DuplicatesShown > 0 {
		problems = append(problems, fmt.Sprintf("%d message(s) shown twice", f.DuplicatesShown))
	}
	if len(f.OrderViolations) > 0 {
		problems = append(problems, "order broken: "+strings.Join(f.OrderViolations, "; "))
	}
	if f.Unsent > 0 {
		problems = append(problems, fmt.Sprintf("%d outbox row(s) unsent", f.Unsent))
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("invariants broken: %s", strings.Join(problems, "; "))
}

// msgNumber returns N for a body "msg N", else fallback.
func msgNumber(body string, fallback int64) int {
	if s, ok := strings.CutPrefix(body, "msg "); ok {
		if n, err := strconv.Atoi(s); err == nil {
			return n
		}
	}
	return int(fallback)
}

// Label returns "msg N" for a consumers' message id, looked up in e's
// consumers.messages ("message <id>" when not found).
func Label(ctx context.Context, e *env.Env, id string) string {
	var body string
	var seq int64
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	err := e.Admin().QueryRow(qctx, `SELECT body, seq FROM consumers.messages WHERE id::text = $1`, id).Scan(&body, &seq)
	if err != nil {
		return "message " + id
	}
	return "msg " + strconv.Itoa(msgNumber(body, seq))
}

// LabelSeq returns "msg N" for the consumers' message with seq in chat.
func LabelSeq(ctx context.Context, e *env.Env, chatID, seq int64) string {
	var body string
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := e.Admin().QueryRow(qctx, `SELECT body FROM consumers.messages WHERE chat_id = $1 AND seq = $2`, chatID, seq).Scan(&body); err != nil {
		return "msg with seq " + strconv.FormatInt(seq, 10)
	}
	return "msg " + strconv.Itoa(msgNumber(body, seq))
}

// ReadFigures reads a run's figures from e's database and the watcher w
// (which watches workers' /ws).
func ReadFigures(ctx context.Context, e *env.Env, w *Watcher) (*Figures, error) {
	f := &Figures{Lost: []int{}}
	rows, err := e.Admin().Query(ctx, `SELECT id::text, chat_id, seq, body FROM consumers.messages ORDER BY chat_id, seq`)
	if err != nil {
		return nil, fmt.Errorf("lab: read consumers.messages: %w", err)
	}
	seen := map[string]bool{}
	for _, s := range w.Frames() {
		if s.Message.From == chat.Consumers {
			seen[s.Message.ID] = true
		}
	}
	for rows.Next() {
		var id, body string
		var chatID, seq int64
		if err := rows.Scan(&id, &chatID, &seq, &body); err != nil {
			rows.Close()
			return nil, fmt.Errorf("lab: read consumers.messages: %w", err)
		}
		f.Saved++
		if !seen[id] {
			f.Lost = append(f.Lost, msgNumber(body, seq))
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("lab: read consumers.messages: %w", err)
	}
	f.Received = len(seen)
	if err := e.Admin().QueryRow(ctx, `SELECT count(*) FROM workers.inbox_duplicates`).Scan(&f.DuplicatesSkipped); err != nil {
		return nil, fmt.Errorf("lab: count duplicates: %w", err)
	}
	if err := e.Admin().QueryRow(ctx, `SELECT count(*) FROM `+e.ConsumersOutbox()+` o WHERE sent_at IS NULL`).Scan(&f.Unsent); err != nil {
		return nil, fmt.Errorf("lab: count unsent: %w", err)
	}
	if err := e.Admin().QueryRow(ctx, `SELECT coalesce(sum(redrives), 0) FROM consumers.messages`).Scan(&f.Redriven); err != nil {
		return nil, fmt.Errorf("lab: count re-drives: %w", err)
	}
	f.DuplicatesShown = w.Duplicates()
	f.OrderViolations = w.OrderViolations()
	return f, nil
}

// Settled reports whether every consumers' message is shown by w, nothing
// is unsent in any partition's outbox, and no job of any partition's
// consumers→workers queue is pending (delivered, not acknowledged). Errors
// (a server down) count as not settled.
func Settled(ctx context.Context, e *env.Env, w *Watcher) bool {
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var ids []string
	rows, err := e.Admin().Query(qctx, `SELECT id::text FROM consumers.messages`)
	if err != nil {
		return false
	}
	for rows.Next() {
		var id string
		if rows.Scan(&id) != nil {
			rows.Close()
			return false
		}
		ids = append(ids, id)
	}
	if rows.Err() != nil {
		return false
	}
	seen := map[string]bool{}
	for _, s := range w.Frames() {
		seen[s.Message.ID] = true
	}
	for _, id := range ids {
		if !seen[id] {
			return false
		}
	}
	var unsent int
	if e.Admin().QueryRow(qctx, `SELECT count(*) FROM `+e.ConsumersOutbox()+` o WHERE sent_at IS NULL`).Scan(&unsent) != nil || unsent > 0 {
		return false
	}
	for p := range max(e.Partitions, 1) {
		if pendingJobs(qctx, e, p) != 0 {
			return false
		}
	}
	return true
}

// pendingJobs returns the number of delivered, unacknowledged entries of
// partition p's consumers→workers queue (-1 on error; 0 when the group
// does not exist); on NATS, those not yet delivered too (Env.NATSPending).
func pendingJobs(ctx context.Context, e *env.Env, p int) int64 {
	if e.Broker == env.BrokerNATS {
		n, err := e.NATSPending(ctx, chat.Consumers, chat.Workers, p)
		if err != nil {
			return -1
		}
		return n
	}
	pe, err := e.RedisClient().XPending(ctx, env.PartitionQueueKeys(chat.Consumers, p).Stream, chat.Workers).Result()
	if err == redis.Nil {
		return 0
	}
	if err != nil {
		if strings.Contains(err.Error(), "NOGROUP") {
			return 0
		}
		return -1
	}
	return pe.Count
}

// WaitSettled waits until Settled holds, asking every interval, or until
// deadline. It returns ctx's error when ctx ends first, else nil: not
// settled by the deadline is for the figures to show.
func WaitSettled(ctx context.Context, e *env.Env, w *Watcher, deadline time.Time, interval time.Duration) error {
	sctx, cancel := context.WithDeadline(ctx, deadline)
	_ = env.WaitFor(sctx, interval, func() bool { return Settled(sctx, e, w) })
	cancel()
	return ctx.Err()
}

// ErrInvariant is wrapped by the errors of experiments that ran but found
// an invariant broken (something lost, shown twice, out of order, left
// unsent).
var ErrInvariant = errors.New("lab: invariant broken")
