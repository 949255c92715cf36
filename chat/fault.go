package chat

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/outbox"
)

// Fault kinds for the lab (Config.Fault, flag --fault, env OUTBOXCHAT_FAULT).
// Each kills the process with SIGKILL — a crash, not a shutdown — at one
// step, the first time a message with the given seq passes it:
//
//	worker-crash-after-commit:SEQ   after the inbox commit, before XACK
//	worker-crash-before-commit:SEQ  after the worker read the job, before the inbox commit
//	relay-crash-after-publish:SEQ   after the relay's publish, before its mark-sent commit
//
// Off by default. A restarted process must be started without the fault (or
// it crashes again at the same step).
const (
	FaultWorkerAfterCommit  = "worker-crash-after-commit"
	FaultWorkerBeforeCommit = "worker-crash-before-commit"
	FaultRelayAfterPublish  = "relay-crash-after-publish"
)

// fault is a parsed fault spec.
type fault struct {
	kind string
	seq  int64
	mu   sync.Mutex
	ref  string // the stream ref of the faulty message, once fetched
}

func (f *fault) armed(ref string) { f.mu.Lock(); f.ref = ref; f.mu.Unlock() }

func (f *fault) isArmed(ref string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ref != "" && f.ref == ref
}

// ParseFault parses a fault spec "KIND:SEQ" ("" = no fault, nil).
func ParseFault(s string) (*fault, error) {
	if s == "" {
		return nil, nil
	}
	kind, n, ok := strings.Cut(s, ":")
	seq, err := strconv.ParseInt(n, 10, 64)
	if !ok || err != nil || seq <= 0 {
		return nil, fmt.Errorf("fault %q: want KIND:SEQ with a positive seq", s)
	}
	switch kind {
	case FaultWorkerAfterCommit, FaultWorkerBeforeCommit, FaultRelayAfterPublish:
	default:
		return nil, fmt.Errorf("fault %q: unknown kind (want %s, %s or %s)", s, FaultWorkerAfterCommit, FaultWorkerBeforeCommit, FaultRelayAfterPublish)
	}
	return &fault{kind: kind, seq: seq}, nil
}

func payloadSeq(payload []byte) int64 {
	var p struct {
		Seq int64 `json:"seq"`
	}
	_ = json.Unmarshal(payload, &p)
	return p.Seq
}

func (f *fault) crash(log *slog.Logger, seq int64) {
	logEvent(log, slog.LevelError, EventFaultCrash, "fault", f.kind, "seq", seq)
	killSelf()
}

func (f *fault) wrapSource(src inbox.Source, log *slog.Logger) inbox.Source {
	if f.kind != FaultWorkerAfterCommit {
		return src
	}
	return faultSource{Source: src, f: f, log: log}
}

func (f *fault) wrapHandler(h inbox.Handler, log *slog.Logger) inbox.Handler {
	if f.kind != FaultWorkerBeforeCommit {
		return h
	}
	return inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, d inbox.Delivery) (bool, error) {
		if payloadSeq(d.Payload) == f.seq {
			f.crash(log, f.seq)
		}
		return h.Apply(ctx, tx, d)
	})
}

func (f *fault) wrapPublisher(p outbox.Publisher, log *slog.Logger) outbox.Publisher {
	if f.kind != FaultRelayAfterPublish {
		return p
	}
	return outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) error {
		if err := p.Publish(ctx, msgs); err != nil {
			return err
		}
		for _, m := range msgs {
			if payloadSeq(m.Payload) == f.seq {
				f.crash(log, f.seq)
			}
		}
		return nil
	})
}

// faultSource crashes in Ack — after the inbox commit — when the batch holds
// the message with the fault's seq. Fetch remembers each ref's seq.
type faultSource struct {
	inbox.Source
	f   *fault
	log *slog.Logger
}

func (s faultSource) Fetch(ctx context.Context, max int) ([]inbox.Delivery, error) {
	ds, err := s.Source.Fetch(ctx, max)
	for _, d := range ds {
		if payloadSeq(d.Payload) == s.f.seq {
			s.f.armed(d.Ref)
		}
	}
	return ds, err
}

func (s faultSource) Ack(ctx context.Context, refs ...string) error {
	for _, r := range refs {
		if s.f.isArmed(r) {
			s.f.crash(s.log, s.f.seq)
		}
	}
	return s.Source.Ack(ctx, refs...)
}
