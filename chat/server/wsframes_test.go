package server

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/auth"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
)

// frameSocket is a test client of typed frames: it writes frames and
// collects the ack and error frames the server answers with (message,
// receipt and other pushed frames are skipped).
type frameSocket struct {
	c       *websocket.Conn
	answers chan chat.AckFrame
	done    chan struct{}
	err     error // why the socket's reads ended; set before done closes
}

// dialFrames opens a WebSocket on chat of base with token and reads its
// answers until it closes.
func dialFrames(t *testing.T, ctx context.Context, base string, chatN int64, token string) *frameSocket {
	t.Helper()
	c, _, err := websocket.Dial(ctx, fmt.Sprintf("ws%s/ws?chat_id=%d", strings.TrimPrefix(base, "http"), chatN), chattest.WSOpts(token))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	c.SetReadLimit(1 << 20)
	s := &frameSocket{c: c, answers: make(chan chat.AckFrame, 1024), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			_, data, err := c.Read(ctx)
			if err != nil {
				s.err = err
				return
			}
			var f chat.AckFrame
			if json.Unmarshal(data, &f) == nil && (f.Type == "ack" || f.Type == "error") {
				s.answers <- f
			}
		}
	}()
	t.Cleanup(func() { c.CloseNow() })
	return s
}

// send writes a send frame.
func (s *frameSocket) send(t *testing.T, ctx context.Context, clientID, body string) {
	t.Helper()
	s.write(t, ctx, fmt.Sprintf(`{"type":"send","client_id":%s,"body":%s}`, chattest.JSONString(clientID), chattest.JSONString(body)))
}

func (s *frameSocket) write(t *testing.T, ctx context.Context, frame string) {
	t.Helper()
	if err := s.c.Write(ctx, websocket.MessageText, []byte(frame)); err != nil {
		t.Fatalf("write %s: %v", frame, err)
	}
}

// next returns the next answer, failing the test when none comes in time.
func (s *frameSocket) next(t *testing.T, ctx context.Context) chat.AckFrame {
	t.Helper()
	select {
	case f := <-s.answers:
		return f
	case <-s.done:
		t.Fatal("the socket closed before its answer")
	case <-ctx.Done():
		t.Fatal("no answer in time")
	}
	return chat.AckFrame{}
}

// framesAPI is the frame tests' fixture: a consumers API (the api role
// alone, changed by mutate, which may be nil) on a fresh harness, and a
// context that ends after timeout or with the test.
func framesAPI(t *testing.T, timeout time.Duration, mutate func(*Config)) (*harness, *running, context.Context) {
	t.Helper()
	h := newHarness(t, "")
	cons := h.startAPI(chat.Consumers, mutate)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return h, cons, ctx
}

// TestWSSendFrames: send frames pipelined on one socket are all acked,
// each once, with the chat's seqs 1..n; a repeated client_id answers the
// first ack and stores nothing more; the same client_id with another body
// and bad frames get error frames naming the field, and store nothing.
func TestWSSendFrames(t *testing.T) {
	t.Parallel()
	h, cons, ctx := framesAPI(t, 30*time.Second, nil)
	s := dialFrames(t, ctx, cons.base, 7, chattest.Token())
	const n = 40
	for i := range n {
		s.send(t, ctx, fmt.Sprintf("c-%d", i), fmt.Sprintf("message %d", i))
	}
	acks := map[string]chat.AckFrame{}
	seqs := map[int64]bool{}
	for range n {
		f := s.next(t, ctx)
		if f.Type != "ack" || f.ID == "" || f.ChatID != 7 || f.SentAt.IsZero() {
			t.Fatalf("answer %+v, want an ack", f)
		}
		if _, dup := acks[f.ClientID]; dup || seqs[f.Seq] {
			t.Fatalf("second ack for %q or seq %d: %+v", f.ClientID, f.Seq, f)
		}
		acks[f.ClientID], seqs[f.Seq] = f, true
	}
	for i := int64(1); i <= n; i++ {
		if !seqs[i] {
			t.Fatalf("no ack with seq %d (seqs %v)", i, seqs)
		}
	}
	// A repeat: the same ack, byte for byte in its fields.
	s.send(t, ctx, "c-3", "message 3")
	if f := s.next(t, ctx); f != acks["c-3"] {
		t.Fatalf("repeat answered %+v, first ack %+v", f, acks["c-3"])
	}
	for _, bad := range []struct{ frame, field, clientID string }{
		{`{"type":"send","client_id":"c-3","body":"another body"}`, "client_id", "c-3"},
		{`{"type":"send","body":"no key"}`, "client_id", ""},
		{`{"type":"send","client_id":"b-1","body":"  "}`, "body", "b-1"},
		{`{"type":"send","client_id":"b-2"}`, "body", "b-2"},
		{`{"type":"send","client_id":"b-3","body":"x","colour":"red"}`, "colour", "b-3"},
		{`{"type":"send","client_id":"b-4","body":"x","chat_id":0}`, "chat_id", "b-4"},
		{`{"type":"send","client_id":"b-5","body":"x","upto_seq":1}`, "upto_seq", "b-5"},
		{`{"type":"shout","client_id":"b-6","body":"x"}`, "type", "b-6"},
		{`{"type":"send","client_id":"` + strings.Repeat("k", 129) + `","body":"x"}`, "client_id", strings.Repeat("k", 129)},
		{`{"type":"send","client_id":"b-7","body":"` + strings.Repeat("a", chat.DefaultMaxBodyBytes+1) + `"}`, "body", "b-7"},
		{`{"type":"send","client_id":"b-8","body":"x"`, "", "b-8"},
	} {
		s.write(t, ctx, bad.frame)
		f := s.next(t, ctx)
		if f.Type != "error" || f.Field != bad.field || f.ClientID != bad.clientID || f.Error == "" {
			t.Errorf("frame %.80s: answer %+v, want an error naming %q for client_id %.10q", bad.frame, f, bad.field, bad.clientID)
		}
	}
	if got := h.Count(t, `SELECT count(*) FROM consumers.messages WHERE chat_id = 7`); got != n {
		t.Fatalf("%d messages stored, want %d", got, n)
	}
	if got := h.Count(t, `SELECT count(DISTINCT client_id) FROM consumers.messages WHERE chat_id = 7`); got != n {
		t.Fatalf("%d distinct client_ids stored, want %d", got, n)
	}
}

// TestWSSendKilledInFlight: a socket killed with sends in flight, then
// every send resent with its client_id on a new socket: each send that was
// acked was stored, the resends ack the same messages, and every client_id
// is stored exactly once.
func TestWSSendKilledInFlight(t *testing.T) {
	t.Parallel()
	h, cons, ctx := framesAPI(t, 60*time.Second, nil)
	const n = 60
	first := dialFrames(t, ctx, cons.base, 9, chattest.Token())
	for i := range n {
		first.send(t, ctx, fmt.Sprintf("k-%d", i), fmt.Sprintf("body %d", i))
	}
	acked := map[string]chat.AckFrame{}
	for range 5 {
		f := first.next(t, ctx)
		acked[f.ClientID] = f
	}
	first.c.CloseNow() // the rest in flight, or not read yet
	<-first.done
	for len(first.answers) > 0 {
		f := <-first.answers
		acked[f.ClientID] = f
	}
	for id := range acked {
		if got := h.Count(t, `SELECT count(*) FROM consumers.messages WHERE chat_id = 9 AND client_id = $1`, id); got != 1 {
			t.Fatalf("acked send %s stored %d times", id, got)
		}
	}
	second := dialFrames(t, ctx, cons.base, 9, chattest.Token())
	for i := range n {
		second.send(t, ctx, fmt.Sprintf("k-%d", i), fmt.Sprintf("body %d", i))
	}
	seqs := map[int64]string{}
	for range n {
		f := second.next(t, ctx)
		if f.Type != "ack" {
			t.Fatalf("resend answered %+v", f)
		}
		if a, ok := acked[f.ClientID]; ok && a != f {
			t.Fatalf("resend of %s acked %+v, first ack %+v", f.ClientID, f, a)
		}
		if other, dup := seqs[f.Seq]; dup {
			t.Fatalf("seq %d acked for %s and %s", f.Seq, other, f.ClientID)
		}
		seqs[f.Seq] = f.ClientID
	}
	if got := h.Count(t, `SELECT count(*) FROM consumers.messages WHERE chat_id = 9`); got != n {
		t.Fatalf("%d messages stored, want %d (one per client_id)", got, n)
	}
	if got := h.Count(t, `SELECT max(seq) FROM consumers.messages WHERE chat_id = 9`); got != n {
		t.Fatalf("max seq %d, want %d (no gaps)", got, n)
	}
}

// TestWSFrameAuthAndRateLimit: a send frame for a chat the token does not
// cover, and one over the user's rate, are answered with error frames, and
// nothing of them is stored; the socket stays open.
func TestWSFrameAuthAndRateLimit(t *testing.T) {
	t.Parallel()
	h, cons, ctx := framesAPI(t, 30*time.Second, func(c *Config) {
		c.API.Guard.UserRate, c.API.Guard.UserBurst = 0.01, 2
	})
	tok := mint(t, "fay", []string{chat.Consumers, chat.Workers}, auth.ChatScope{IDs: []int64{1}}, time.Hour)
	s := dialFrames(t, ctx, cons.base, 1, tok) // the upgrade takes the first token of 2
	s.write(t, ctx, `{"type":"send","client_id":"x-1","body":"elsewhere","chat_id":2}`)
	if f := s.next(t, ctx); f.Type != "error" || f.Field != "chat_id" || f.ClientID != "x-1" || !strings.Contains(f.Error, "does not cover chat 2") {
		t.Fatalf("send to an uncovered chat: %+v, want an error naming chat_id", f)
	}
	s.send(t, ctx, "x-2", "allowed")
	if f := s.next(t, ctx); f.Type != "ack" || f.ClientID != "x-2" {
		t.Fatalf("send within the rate: %+v, want an ack", f)
	}
	s.send(t, ctx, "x-3", "too fast")
	if f := s.next(t, ctx); f.Type != "error" || f.ClientID != "x-3" || !strings.Contains(f.Error, "too many messages: retry after") {
		t.Fatalf("send over the rate: %+v, want a rate-limit error frame", f)
	}
	if got := h.Count(t, `SELECT count(*) FROM consumers.messages`); got != 1 {
		t.Fatalf("%d messages stored, want 1", got)
	}
	if got := h.Count(t, `SELECT count(*) FROM consumers.messages WHERE client_id = 'x-2' AND author = 'fay'`); got != 1 {
		t.Fatalf("the acked send is not stored as fay's")
	}
}

// TestWSHugeFrameClosesOnlyItsSocket: a frame over the socket's read
// limit closes that socket with 1009 (message too big) and stores
// nothing; another socket on the same chat goes on being answered, and a
// short frame after long ones on it decodes whole (the frames share one
// read buffer).
func TestWSHugeFrameClosesOnlyItsSocket(t *testing.T) {
	t.Parallel()
	h, cons, ctx := framesAPI(t, 30*time.Second, nil)
	good := dialFrames(t, ctx, cons.base, 8, chattest.Token())
	bad := dialFrames(t, ctx, cons.base, 8, chattest.Token())
	huge := `{"type":"send","client_id":"h-1","body":"` + strings.Repeat("a", 7*chat.DefaultMaxBodyBytes) + `"}`
	_ = bad.c.Write(ctx, websocket.MessageText, []byte(huge))
	select {
	case <-bad.done:
	case <-ctx.Done():
		t.Fatal("the socket that sent a huge frame is still open")
	}
	if websocket.CloseStatus(bad.err) != websocket.StatusMessageTooBig {
		t.Errorf("huge frame's socket closed with %v, want 1009 (message too big)", bad.err)
	}
	good.send(t, ctx, "g-1", strings.Repeat("b", chat.DefaultMaxBodyBytes))
	good.send(t, ctx, "g-2", "short")
	acked := map[string]bool{}
	for range 2 {
		if f := good.next(t, ctx); f.Type == "ack" {
			acked[f.ClientID] = true
		} else {
			t.Fatalf("answer %+v, want an ack", f)
		}
	}
	if !acked["g-1"] || !acked["g-2"] {
		t.Fatalf("acked %v, want g-1 and g-2 (in any order)", acked)
	}
	if got := h.Count(t, `SELECT count(*) FROM consumers.messages WHERE chat_id = 8 AND client_id = 'h-1'`); got != 0 {
		t.Fatalf("the huge frame stored %d row(s)", got)
	}
	if got := h.Count(t, `SELECT count(*) FROM consumers.messages WHERE chat_id = 8 AND client_id = 'g-2' AND body = 'short'`); got != 1 {
		t.Fatalf("the short frame after a long one stored %d row(s) with its body, want 1", got)
	}
}

// TestWSOlderSendFrameMayHoldTheWordType: a send frame of the older
// protocol ({"body": …[, "client_id": …]}, no "type" key) whose text holds
// "type" as a value is still a send, not a typed frame without its type.
func TestWSOlderSendFrameMayHoldTheWordType(t *testing.T) {
	t.Parallel()
	h, cons, ctx := framesAPI(t, 30*time.Second, nil)
	s := dialFrames(t, ctx, cons.base, 8, chattest.Token())
	s.write(t, ctx, `{"body":"type"}`)
	s.write(t, ctx, `{"body":"hello","client_id":"type"}`)
	// The older frames are stored before the socket reads the next frame:
	// its ack says they are done.
	s.send(t, ctx, "after", "typed")
	if f := s.next(t, ctx); f.Type != "ack" || f.ClientID != "after" {
		t.Fatalf("answer %+v, want the typed send's ack (no error for the older frames)", f)
	}
	if got := h.Count(t, `SELECT count(*) FROM consumers.messages WHERE chat_id = 8 AND (body = 'type' OR client_id = 'type')`); got != 2 {
		t.Fatalf("%d of the 2 older frames stored", got)
	}
}
