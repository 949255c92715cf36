package fault

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/server"
	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/outbox"
)

// The crash points (the KIND of a --fault spec KIND:SEQ).
const (
	WorkerAfterCommit  = "worker-crash-after-commit"
	WorkerBeforeCommit = "worker-crash-before-commit"
	RelayAfterPublish  = "relay-crash-after-publish"
)

// EventCrash is the event kind logged right before a fault kills the
// process (attributes fault, seq).
const EventCrash = "chat.fault_crash"

// Crash is a parsed --fault spec: it implements server.Hooks, wrapping only the part
// its kind needs. Safe for concurrent use.
type Crash struct {
	kind string
	seq  int64
	log  *slog.Logger
	// kill ends the process; a field so the package's tests can watch it.
	kill func()

	mu  sync.Mutex
	ref string // the stream ref of the faulty message, once fetched
}

var _ server.Hooks = (*Crash)(nil)

// ParseCrash parses a spec "KIND:SEQ" (SEQ a positive message seq). It returns
// nil, nil for "" (no fault), and an error naming the spec for anything
// else that is not a known kind with a positive seq. log receives the
// EventCrash line (nil: slog.Default()).
func ParseCrash(spec string, log *slog.Logger) (*Crash, error) {
	if spec == "" {
		return nil, nil
	}
	kind, n, ok := strings.Cut(spec, ":")
	seq, err := strconv.ParseInt(n, 10, 64)
	if !ok || err != nil || seq <= 0 {
		return nil, fmt.Errorf("fault %q: want KIND:SEQ with a positive seq", spec)
	}
	switch kind {
	case WorkerAfterCommit, WorkerBeforeCommit, RelayAfterPublish:
	default:
		return nil, fmt.Errorf("fault %q: unknown kind (want %s, %s or %s)", spec, WorkerAfterCommit, WorkerBeforeCommit, RelayAfterPublish)
	}
	if log == nil {
		log = slog.Default()
	}
	return &Crash{kind: kind, seq: seq, log: log, kill: killSelf}, nil
}

// Kind is the crash point (WorkerAfterCommit, …).
func (f *Crash) Kind() string { return f.kind }

// Seq is the seq of the message whose passage triggers the fault.
func (f *Crash) Seq() int64 { return f.seq }

func (f *Crash) crash() {
	f.log.Error(chat.EventLogMsg, chat.EventKey, EventCrash, "fault", f.kind, "seq", f.seq)
	f.kill()
}

// payloadSeq is the seq of a message event's payload (the message JSON), 0
// for anything else (receipts).
func payloadSeq(payload []byte) int64 {
	var p struct {
		Seq int64 `json:"seq"`
	}
	_ = json.Unmarshal(payload, &p)
	return p.Seq
}

// Publisher crashes after a publish that carried the fault's seq
// (RelayAfterPublish); other kinds return p.
func (f *Crash) Publisher(p outbox.Publisher) outbox.Publisher {
	if f.kind != RelayAfterPublish {
		return p
	}
	return outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) error {
		if err := p.Publish(ctx, msgs); err != nil {
			return err
		}
		for _, m := range msgs {
			if payloadSeq(m.Payload) == f.seq {
				f.crash()
			}
		}
		return nil
	})
}

// Handler crashes before the inbox statement of the fault's seq
// (WorkerBeforeCommit); other kinds return h.
func (f *Crash) Handler(h inbox.Handler) inbox.Handler {
	if f.kind != WorkerBeforeCommit {
		return h
	}
	return inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, d inbox.Delivery) (bool, error) {
		if payloadSeq(d.Payload) == f.seq {
			f.crash()
		}
		return h.Apply(ctx, tx, d)
	})
}

// Source crashes in Ack — after the inbox commit — when the acknowledged
// refs include the fault's seq (WorkerAfterCommit); other kinds return src.
func (f *Crash) Source(src inbox.Source) inbox.Source {
	if f.kind != WorkerAfterCommit {
		return src
	}
	return faultSource{Source: src, f: f}
}

// faultSource remembers the ref of the fault's seq in Fetch and crashes in
// Ack when it comes.
type faultSource struct {
	inbox.Source
	f *Crash
}

func (s faultSource) Fetch(ctx context.Context, max int) ([]inbox.Delivery, error) {
	ds, err := s.Source.Fetch(ctx, max)
	for _, d := range ds {
		if payloadSeq(d.Payload) == s.f.seq {
			s.f.mu.Lock()
			s.f.ref = d.Ref
			s.f.mu.Unlock()
		}
	}
	return ds, err
}

func (s faultSource) Ack(ctx context.Context, refs ...string) error {
	s.f.mu.Lock()
	armed := s.f.ref
	s.f.mu.Unlock()
	for _, r := range refs {
		if armed != "" && r == armed {
			s.f.crash()
		}
	}
	return s.Source.Ack(ctx, refs...)
}

// killSelf ends the process at once, as a crash would: no deferred
// functions, no graceful stop.
func killSelf() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}
