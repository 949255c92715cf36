package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/auth"
	"github.com/outboxchat/outboxchat/chat/server"
	"github.com/outboxchat/outboxchat/chat/trace"
	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/outbox"
)

// poisonOnce is the workers' Hooks for the trace test: the first delivery
// of a message of chat poisonChat is refused as malformed (dead-lettered);
// the others, and the re-drive's copy, go through.
type poisonOnce struct{ done atomic.Bool }

const poisonChat = 5

func (h *poisonOnce) Publisher(p outbox.Publisher) outbox.Publisher { return p }
func (h *poisonOnce) Source(s inbox.Source) inbox.Source            { return s }
func (h *poisonOnce) Handler(next inbox.Handler) inbox.Handler {
	return inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, d inbox.Delivery) (bool, error) {
		if m, err := chat.DecodeEvent(d.Payload); err == nil && m.ChatID == poisonChat && h.done.CompareAndSwap(false, true) {
			return false, fmt.Errorf("%w: refused by the test", inbox.ErrMalformed)
		}
		return next.Apply(ctx, tx, d)
	})
}

// serveForTrace runs service in this process on the test's database and
// Redis and returns its HTTP base URL; it stops at cleanup.
func serveForTrace(t *testing.T, dbURL, redisURL, prefix, service string, hooks server.Hooks) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(service)
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- server.Serve(ctx, server.Config{
			Service: service, DatabaseURL: u.String(), RedisURL: redisURL, RedisPrefix: prefix,
			LockDuration: 2 * time.Second, Hooks: hooks, Logger: slog.New(slog.DiscardHandler),
			API: server.APIConfig{HTTPAddr: "127.0.0.1:0", Auth: auth.Config{Insecure: true},
				Listening: func(a string) { addr <- a }},
			Relay: server.RelayConfig{PollInterval: 100 * time.Millisecond, RedriveAfter: 1500 * time.Millisecond},
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case a := <-addr:
		return "http://" + a
	case err := <-done:
		done <- err
		t.Fatalf("serve %s: %v", service, err)
	case <-time.After(30 * time.Second):
		t.Fatalf("serve %s: not listening after 30 s", service)
	}
	return ""
}

// TestTraceCommand: a message the receiver dead-lettered once and the
// re-drive published again is traced stage by stage, by id and by chat and
// seq; the JSON has the contract's fields and stages in time order.
func TestTraceCommand(t *testing.T) {
	ctx := context.Background()
	dbURL, admin := migratedDatabase(t)
	redisURL, prefix := testenv.RedisURL(t), testenv.Prefix(t)
	cons := serveForTrace(t, dbURL, redisURL, prefix, chat.Consumers, nil)
	serveForTrace(t, dbURL, redisURL, prefix, chat.Workers, &poisonOnce{})

	resp, err := http.Post(fmt.Sprintf("%s/api/chats/%d/messages", cons, poisonChat), "application/json", strings.NewReader(`{"body":"follow me"}`))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var m chat.Message
	if resp.StatusCode != http.StatusCreated || json.Unmarshal(raw, &m) != nil {
		t.Fatalf("send: %d %s", resp.StatusCode, raw)
	}
	testenv.WaitFor(t, 30*time.Second, "the message re-driven, received and its receipt back", func() bool {
		var redrives int
		var delivered bool
		err := admin.QueryRow(ctx, `SELECT m.redrives, EXISTS (SELECT 1 FROM consumers.receipts r WHERE r.chat_id = m.chat_id AND r.upto_seq >= m.seq)
			FROM consumers.messages m WHERE m.id = $1`, m.ID).Scan(&redrives, &delivered)
		return err == nil && redrives > 0 && delivered
	})

	conn := []string{"--database-url", dbURL, "--redis-url", redisURL, "--redis-prefix", prefix}
	out, err := runCmd(t, append([]string{"trace", "--message-id", m.ID, "--json"}, conn...)...)
	if err != nil {
		t.Fatalf("trace: %v\n%s", err, out)
	}
	var got struct {
		MessageID string `json:"message_id"`
		Stages    []struct {
			Stage    string     `json:"stage"`
			At       *time.Time `json:"at"`
			State    string     `json:"state"`
			Reason   string     `json:"reason"`
			StreamID string     `json:"stream_id"`
			Redrives int64      `json:"redrives"`
		} `json:"stages"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil || got.MessageID != m.ID {
		t.Fatalf("trace --json: %v\n%s", err, out)
	}
	count := map[string]int{}
	var last time.Time
	var deadEntry, receivedEntry string
	for _, s := range got.Stages {
		count[s.Stage]++
		if s.At == nil {
			t.Errorf("stage %s has no time:\n%s", s.Stage, out)
			continue
		}
		if s.At.Before(last) {
			t.Errorf("stage %s at %v is before the one above it (%v): not in time order", s.Stage, s.At, last)
		}
		last = *s.At
		switch s.Stage {
		case trace.StageDeadLettered:
			deadEntry = s.StreamID
			if !strings.Contains(s.Reason, "refused by the test") {
				t.Errorf("dead letter reason %q", s.Reason)
			}
		case trace.StageReceived:
			receivedEntry = s.StreamID
			if s.State != trace.StateShown {
				t.Errorf("received state %q, want shown", s.State)
			}
		case trace.StageRedriven:
			if s.Redrives < 1 {
				t.Errorf("redriven with %d redrives", s.Redrives)
			}
		}
	}
	for _, st := range []string{trace.StageStored, trace.StageDeadLettered, trace.StageRedriven, trace.StageReceived, trace.StageDelivered} {
		if count[st] != 1 {
			t.Errorf("%d %s stages, want 1:\n%s", count[st], st, out)
		}
	}
	// Two stream entries: the first publish (dead-lettered) and the
	// re-drive's copy (stored in the inbox).
	if count[trace.StagePublished] < 2 || deadEntry == "" || receivedEntry == "" || deadEntry == receivedEntry {
		t.Errorf("published %d times, dead letter of entry %q, inbox row from entry %q: want two entries:\n%s",
			count[trace.StagePublished], deadEntry, receivedEntry, out)
	}
	if count[trace.StageOutbox] != 0 {
		t.Errorf("an outbox stage for a published message:\n%s", out)
	}

	text, err := runCmd(t, append([]string{"trace", "--chat", fmt.Sprint(poisonChat), "--seq", "1"}, conn...)...)
	t.Logf("trace --json:\n%s\ntrace --chat --seq:\n%s", out, text)
	if err != nil || !strings.Contains(text, m.ID) || !strings.Contains(text, "dead_lettered") || !strings.Contains(text, "delivered") {
		t.Fatalf("trace --chat --seq: %v\n%s", err, text)
	}
	if _, err := runCmd(t, append([]string{"trace", "--message-id", "0190f0b4-0000-7000-8000-000000000000"}, conn...)...); !errors.Is(err, trace.ErrNotFound) {
		t.Fatalf("unknown id: %v, want ErrNotFound", err)
	}
	if _, err := runCmd(t, "trace", "--chat", "1"); err == nil {
		t.Fatal("--chat without --seq accepted")
	}
}

// Without Redis the text says a published stage's state was not read; it
// does not print trimmed, which it cannot know.
func TestTraceTextWithoutRedis(t *testing.T) {
	at := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	tr := &trace.Trace{MessageID: "m", Service: chat.Consumers, Receiver: chat.Workers, ChatID: 1, Seq: 1,
		Stages: []trace.Stage{{Stage: trace.StageStored, At: &at, Service: chat.Consumers},
			{Stage: trace.StagePublished, At: &at, Service: chat.Consumers, StreamID: "1-0", State: trace.StateNotRead}},
		Errors: []string{"redis: no --redis-url: stream entries and dead letters not read"}}
	var b strings.Builder
	writeTrace(&b, tr)
	var published string
	for _, line := range strings.Split(b.String(), "\n") {
		if strings.Contains(line, " published ") {
			published = line
		}
	}
	if !strings.Contains(published, "unknown (Redis not read)") || strings.Contains(published, trace.StateNotRead) {
		t.Errorf("published line %q, want its state unknown (Redis not read):\n%s", published, b.String())
	}
}
