package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/outboxchat/outboxchat/chat"
)

// Where a cutProxy cuts an armed connection.
const (
	cutAfterCommit  = iota // after forwarding COMMIT's answer, before its ReadyForQuery
	cutCommitAnswer        // instead of forwarding COMMIT's answer (the commit happened)
	cutBeforeSend          // the client's write holding marker is not forwarded (the server never gets it)
	cutAnswers             // instead of forwarding each answer that tags names, in turn (not armed: tags is the trigger)
)

// cutProxy forwards connections to a Postgres server (sslmode=disable, so
// the server's messages can be read one by one); once armed it cuts the
// next connection that reaches the point its mode names, once.
type cutProxy struct {
	ln     net.Listener
	target string
	mode   int
	marker []byte // cutBeforeSend's; set before armed
	armed  atomic.Bool
	cuts   atomic.Int64

	mu   sync.Mutex
	tags [][]string // cutAnswers': the command tags to cut at, in turn, each one of its alternatives
}

// cutAt makes a cutAnswers proxy cut the connection at the next answer
// (CommandComplete) whose tag is one of tags ("COMMIT", "SELECT 1"), instead
// of forwarding it; calls queue up, in order.
func (p *cutProxy) cutAt(tags ...string) {
	p.mu.Lock()
	p.tags = append(p.tags, tags)
	p.mu.Unlock()
}

// cutTag reports whether the answer tagged tag is the next one to cut, and
// takes it off the queue if so.
func (p *cutProxy) cutTag(tag string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.tags) == 0 || !slices.Contains(p.tags[0], tag) {
		return false
	}
	p.tags = p.tags[1:]
	p.cuts.Add(1)
	return true
}

func newCutProxy(t *testing.T, target string, mode int) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target, mode: mode}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { p.serve(c) })
		}
	})
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return p
}

// via returns u (a Postgres URL) with its host replaced by the proxy's.
func (p *cutProxy) via(t *testing.T, u string) string {
	t.Helper()
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	pu.Host = p.ln.Addr().String()
	q := pu.Query()
	q.Set("sslmode", "disable")
	pu.RawQuery = q.Encode()
	return pu.String()
}

func (p *cutProxy) cut() bool {
	if p.armed.CompareAndSwap(true, false) {
		p.cuts.Add(1)
		return true
	}
	return false
}

func (p *cutProxy) serve(client net.Conn) {
	defer client.Close()
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer server.Close()
	go func() { // client → server
		defer server.Close()
		buf := make([]byte, 64<<10)
		for {
			n, err := client.Read(buf)
			if n > 0 && p.mode == cutBeforeSend && p.armed.Load() && bytes.Contains(buf[:n], p.marker) && p.cut() {
				client.Close()
				return
			}
			if n > 0 {
				if _, werr := server.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	hdr := make([]byte, 5)
	for { // server → client, message by message
		if _, err := io.ReadFull(server, hdr); err != nil {
			return
		}
		body := make([]byte, int(binary.BigEndian.Uint32(hdr[1:]))-4)
		if _, err := io.ReadFull(server, body); err != nil {
			return
		}
		commit := hdr[0] == 'C' && bytes.Equal(body, []byte("COMMIT\x00"))
		if commit && p.mode == cutCommitAnswer && p.cut() {
			return
		}
		if hdr[0] == 'C' && p.mode == cutAnswers && p.cutTag(string(bytes.TrimSuffix(body, []byte{0}))) {
			return
		}
		if _, err := client.Write(append(hdr[:5:5], body...)); err != nil {
			return
		}
		if commit && p.mode == cutAfterCommit && p.cut() {
			return
		}
	}
}

// A send batch whose connection fails once its COMMIT is sent is answered
// by what Postgres did, not by the failure: stored (the answer came, or the
// outcome read under the chat's lock finds the message) is a success; not
// stored is the error, for a batch that held its chat's lock from its first
// round trip; and a one-round-trip batch not found stored is "outcome
// unknown" (it might yet take its locks), never a plain "nothing stored".
// Chat 1's first send reads its last seq (two round trips) and leaves a
// hint, so its second is a one-round-trip batch; chat 2's hint is made
// stale by a second Store writing the chat, and found so, after which its
// batches read (two round trips) for a while.
func TestSendAnswerFollowsTheCommit(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name        string
		mode        int
		stored      bool // the cut send's message is in the table
		hintedErr   error
		twoTripsErr error
		reported    []string // the outcomes reported (SendMetrics.CommitAnswerLost, the log)
	}{
		{"cut after COMMIT's answer", cutAfterCommit, true, nil, nil, nil},
		{"COMMIT's answer lost", cutCommitAnswer, true, nil, nil, []string{"stored", "stored"}},
		{"batch never reaches the server", cutBeforeSend, false, chat.ErrSendOutcomeUnknown, nil, []string{"unknown", "not_stored"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newBatchEnv(t, 0)
			proxy := newCutProxy(t, hostOf(t, e.h.RoleURL(chat.Consumers)), c.mode)
			s := storeOn(t, proxy.via(t, e.h.RoleURL(chat.Consumers)))
			// Set before the first Send, whose enqueue (under s.mu) orders
			// these writes before the committer's reads.
			var reported []string
			var logged bytes.Buffer
			s.metrics = &SendMetrics{CommitAnswerLost: func(o string) { reported = append(reported, o) }}
			s.log = slog.New(slog.NewTextHandler(&logged, nil))
			other := e.secondStore(t)
			// cutSend sends body to chatN through s with the proxy armed
			// (body is the marker cutBeforeSend looks for) and checks the
			// answer against what is stored.
			cutSend := func(chatN int64, body string, wantErr error) error {
				proxy.marker = []byte(body)
				cuts := proxy.cuts.Load()
				proxy.armed.Store(true)
				m, err := s.Send(context.Background(), chatN, body, "")
				if proxy.cuts.Load() != cuts+1 {
					t.Fatalf("chat %d: the proxy cut %d connections, want 1", chatN, proxy.cuts.Load()-cuts)
				}
				checkCutSend(t, e, chatN, body, m, err, c.stored, wantErr)
				return err
			}

			// Chat 1: a hint, then the cut one-round-trip batch.
			sendSeq(t, s, 1, "first")
			hits := s.hints.hits.Load()
			if err := cutSend(1, "hinted", c.hintedErr); err == nil && s.hints.hits.Load() != hits+1 {
				t.Errorf("the cut send was not a one-round-trip batch (hinted batches %d → %d)", hits, s.hints.hits.Load())
			}

			// Chat 2: its hint made stale by the other Store and found so,
			// so the batch reads its last seq (two round trips) and the cut
			// hits the second, which holds the message.
			sendSeq(t, s, 2, "first")
			sendSeq(t, other, 2, "other")
			sendSeq(t, s, 2, "stale hint found")
			cutSend(2, "two round trips", c.twoTripsErr)

			// The Store goes on; every chat's seqs stay gap-free, each
			// message with its outbox event.
			sendSeq(t, s, 1, "after")
			sendSeq(t, s, 2, "after")
			e.checkConsistent(t)
			if !slices.Equal(reported, c.reported) {
				t.Errorf("lost COMMIT answers reported %q, want %q", reported, c.reported)
			}
			if n := strings.Count(logged.String(), "COMMIT's answer lost"); n != len(c.reported) {
				t.Errorf("%d warnings logged, want %d:\n%s", n, len(c.reported), logged.String())
			}
		})
	}
}

// The outcome read decides once it has read, whatever becomes of its own
// transaction afterwards, and a read whose connection fails before it has
// read is made again: a send whose COMMIT answer is lost is answered as
// stored when the read finds it, even when the read's connection is cut
// too, at the end of its transaction or at its first statement.
func TestOutcomeReadSurvivesItsOwnCut(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		read []string // where the outcome read's connection is cut
	}{
		{"the read's transaction end", []string{"COMMIT", "ROLLBACK"}},
		{"the read's first statement", []string{"SELECT 1", "SET", "BEGIN"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newBatchEnv(t, 0)
			proxy := newCutProxy(t, hostOf(t, e.h.RoleURL(chat.Consumers)), cutAnswers)
			s := storeOn(t, proxy.via(t, e.h.RoleURL(chat.Consumers)))
			var reported []string
			s.metrics = &SendMetrics{CommitAnswerLost: func(o string) { reported = append(reported, o) }}
			s.log = slog.New(slog.NewTextHandler(io.Discard, nil))
			sendSeq(t, s, 1, "first") // a hint: the next batch commits in one round trip
			proxy.cutAt("COMMIT")     // the send's
			proxy.cutAt(c.read...)
			m, err := s.Send(context.Background(), 1, "cut twice", "")
			if n := proxy.cuts.Load(); n != 2 {
				t.Fatalf("the proxy cut %d connections, want 2", n)
			}
			checkCutSend(t, e, 1, "cut twice", m, err, true, nil)
			if !slices.Equal(reported, []string{"stored"}) {
				t.Errorf("lost COMMIT answers reported %q, want [stored]", reported)
			}
			sendSeq(t, s, 1, "after")
			e.checkConsistent(t)
		})
	}
}

// checkCutSend checks the answer (m, err) to a send of body to chatN whose
// connection was cut: stored or not as want, and err as wantErr: nil (then
// m is the stored message), chat.ErrSendOutcomeUnknown, or, when the
// message is not stored and wantErr is nil, any error.
func checkCutSend(t *testing.T, e *batchEnv, chatN int64, body string, m chat.Message, err error, stored bool, wantErr error) {
	t.Helper()
	n := e.count(t, `SELECT count(*) FROM consumers.messages WHERE chat_id = $1 AND body = $2`, chatN, body)
	if stored != (n == 1) || n > 1 {
		t.Fatalf("chat %d %q: %d rows stored, want stored=%v", chatN, body, n, stored)
	}
	switch {
	case stored && err != nil:
		t.Errorf("chat %d %q: stored, but answered %v", chatN, body, err)
	case stored:
		seq := e.count(t, `SELECT seq FROM consumers.messages WHERE id = $1::uuid`, m.ID)
		if int64(seq) != m.Seq || m.Body != body {
			t.Errorf("chat %d: answered %+v, stored seq %d", chatN, m, seq)
		}
	case err == nil:
		t.Errorf("chat %d %q: not stored, but answered %+v", chatN, body, m)
	case wantErr != nil && !errors.Is(err, wantErr):
		t.Errorf("chat %d %q: answered %v, want %v", chatN, body, err, wantErr)
	case wantErr == nil && errors.Is(err, chat.ErrSendOutcomeUnknown):
		t.Errorf("chat %d %q: answered %v, want a plain failure (the outcome is known: not stored)", chatN, body, err)
	}
}

func hostOf(t *testing.T, u string) string {
	t.Helper()
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	return pu.Host
}
