package gateway

import (
	"errors"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/chat"
)

// The cursor's state machine, fed rows by hand and a fake clock: no
// database, no sleeping.

// t0 is the fake clock's origin.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// rows builds messages of one origin with the given seqs; sent_at follows
// seq so that the merge keeps a simple order.
func rows(from string, seqs ...int64) []chat.Message {
	out := make([]chat.Message, len(seqs))
	for i, q := range seqs {
		out[i] = chat.Message{ID: from + "-" + string(rune('a'+q)), ChatID: 1, Seq: q, From: from, SentAt: t0.Add(time.Duration(q) * time.Millisecond)}
	}
	return out
}

func seqsOf(ms []chat.Message, from string) []int64 {
	var out []int64
	for _, m := range ms {
		if m.From == from {
			out = append(out, m.Seq)
		}
	}
	return out
}

func TestCursorAdvance(t *testing.T) {
	const gap = time.Minute
	type step struct {
		at         time.Duration // fake clock, from t0
		sent, recv []int64
		// want: pushed seqs per origin, held, and the cursor afterwards
		pushSent, pushRecv []int64
		held               bool
		wantSent, wantRecv int64
		holding            bool
		holdUntil          time.Duration // -1: none
		notes              []cursorNote
	}
	tests := []struct {
		name       string
		start      cursor
		gapTimeout time.Duration
		steps      []step
	}{
		{
			name: "in order: everything pushed, nothing held",
			steps: []step{
				{sent: []int64{1, 2}, recv: []int64{1, 2, 3}, pushSent: []int64{1, 2}, pushRecv: []int64{1, 2, 3},
					wantSent: 2, wantRecv: 3, holdUntil: -1},
			},
			gapTimeout: gap,
		},
		{
			name:       "rows at or below the cursor are not pushed again",
			start:      cursor{sent: 2, recv: 3},
			gapTimeout: gap,
			steps: []step{
				{sent: []int64{1, 2, 3}, recv: []int64{2, 3, 4}, pushSent: []int64{3}, pushRecv: []int64{4},
					wantSent: 3, wantRecv: 4, holdUntil: -1},
			},
		},
		{
			name:       "a sent gap stops the sent cursor (sends come in order; a read fills it)",
			gapTimeout: gap,
			steps: []step{
				{sent: []int64{1, 3}, pushSent: []int64{1}, wantSent: 1, holdUntil: -1},
				{sent: []int64{2, 3}, pushSent: []int64{2, 3}, wantSent: 3, holdUntil: -1},
			},
		},
		{
			name:       "received gap held, then filled in time: seq order kept",
			gapTimeout: gap,
			steps: []step{
				{at: 0, recv: []int64{1, 3, 4}, pushRecv: []int64{1}, held: true, wantRecv: 1, holding: true, holdUntil: gap},
				{at: 10 * time.Second, recv: []int64{3, 4}, held: true, wantRecv: 1, holding: true, holdUntil: gap},
				{at: 20 * time.Second, recv: []int64{2, 3, 4}, pushRecv: []int64{2, 3, 4}, wantRecv: 4, holdUntil: -1},
			},
		},
		{
			name:       "received gap held for the timeout, then pushed past; the late one later, nothing twice",
			gapTimeout: gap,
			steps: []step{
				{at: 0, recv: []int64{1, 3}, pushRecv: []int64{1}, held: true, wantRecv: 1, holding: true, holdUntil: gap},
				{at: gap, recv: []int64{3, 4}, pushRecv: []int64{3, 4}, held: true, wantRecv: 1, holding: true, holdUntil: -1,
					notes: []cursorNote{{pushedPast: true, missing: 2, next: 3}}},
				// Already pushed past: nothing new, still waiting for 2.
				{at: gap + time.Second, recv: []int64{3, 4}, wantRecv: 1, holding: true, holdUntil: -1},
				{at: gap + 2*time.Second, recv: []int64{2, 3, 4, 5}, pushRecv: []int64{2, 5}, wantRecv: 5, holdUntil: -1},
			},
		},
		{
			name:       "no hold (negative timeout): pushed as they arrive",
			gapTimeout: -1,
			steps: []step{
				{recv: []int64{1, 3}, pushRecv: []int64{1, 3}, held: true, wantRecv: 1, holding: true, holdUntil: -1},
				{recv: []int64{2}, pushRecv: []int64{2}, wantRecv: 3, holdUntil: -1},
			},
		},
		{
			name:       "gives up after maxAboveGap pushed past: watermark jumps, the late one is history",
			gapTimeout: -1,
			steps: []step{
				{recv: seqRange(2, 1+maxAboveGap), pushRecv: seqRange(2, 1+maxAboveGap), held: true,
					wantRecv: 1 + maxAboveGap, holdUntil: -1,
					notes: []cursorNote{{gaveUp: true, newWatermark: 1 + maxAboveGap}}},
				{recv: []int64{1}, wantRecv: 1 + maxAboveGap, holdUntil: -1},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.start
			for i, st := range tt.steps {
				out, held, notes := c.advance(rows(chat.Workers, st.sent...), rows(chat.Consumers, st.recv...), t0.Add(st.at), tt.gapTimeout)
				if got := seqsOf(out, chat.Workers); !slices.Equal(got, st.pushSent) {
					t.Errorf("step %d: pushed sent %v, want %v", i, got, st.pushSent)
				}
				if got := seqsOf(out, chat.Consumers); !slices.Equal(got, st.pushRecv) {
					t.Errorf("step %d: pushed received %v, want %v", i, got, st.pushRecv)
				}
				if held != st.held {
					t.Errorf("step %d: held %v, want %v", i, held, st.held)
				}
				if c.sent != st.wantSent || c.recv != st.wantRecv || c.holding() != st.holding {
					t.Errorf("step %d: cursor sent %d recv %d holding %v, want %d %d %v",
						i, c.sent, c.recv, c.holding(), st.wantSent, st.wantRecv, st.holding)
				}
				wantUntil := time.Time{}
				if st.holdUntil >= 0 {
					wantUntil = t0.Add(st.holdUntil)
				}
				if got := c.holdUntil(tt.gapTimeout); !got.Equal(wantUntil) {
					t.Errorf("step %d: holdUntil %v, want %v", i, got, wantUntil)
				}
				if !slices.Equal(notes, st.notes) {
					t.Errorf("step %d: notes %+v, want %+v", i, notes, st.notes)
				}
			}
		})
	}
}

func seqRange(from, to int64) []int64 {
	var out []int64
	for q := from; q <= to; q++ {
		out = append(out, q)
	}
	return out
}

func TestCursorTakes(t *testing.T) {
	for _, tt := range []struct {
		name       string
		c          cursor
		sent, recv []int64
		want       bool
	}{
		{"next of both", cursor{sent: 2, recv: 5}, []int64{3}, []int64{6}, true},
		{"overlapping rows", cursor{sent: 2, recv: 5}, []int64{1, 2, 3}, []int64{4, 5, 6}, true},
		{"nothing", cursor{sent: 2, recv: 5}, nil, nil, true},
		{"sent ahead", cursor{sent: 2, recv: 5}, []int64{4}, nil, false},
		{"received ahead", cursor{sent: 2, recv: 5}, nil, []int64{7}, false},
		{"holding a gap", cursor{recv: 5, gapSince: t0}, nil, []int64{6}, false},
		{"pushed past a gap", cursor{recv: 5, above: map[int64]bool{7: true}}, nil, []int64{6}, false},
	} {
		if got := tt.c.takes(rows(chat.Workers, tt.sent...), rows(chat.Consumers, tt.recv...)); got != tt.want {
			t.Errorf("%s: takes = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// A frame that cannot be encoded is dropped before the cursor moves, so it
// is a gap, not a message skipped after the cursor passed it.
func TestRoomRowsEncodeDropsUnencodable(t *testing.T) {
	rr := &roomRows{recv: rows(chat.Consumers, 1, 2, 3)}
	rr.encode(slog.New(slog.NewTextHandler(io.Discard, nil)), func(m chat.Message) ([]byte, error) {
		if m.Seq == 2 {
			return nil, errors.New("cannot encode")
		}
		return encodeFrame(m)
	})
	if got := seqsOf(rr.recv, chat.Consumers); !slices.Equal(got, []int64{1, 3}) {
		t.Fatalf("rows after encode %v, want [1 3]", got)
	}
	for _, m := range rr.recv {
		if len(rr.frames.lookup(frameKey{m.From, m.ID})) == 0 {
			t.Fatalf("no frame for seq %d", m.Seq)
		}
	}
	c := cursor{}
	out, held, _ := c.advance(nil, rr.recv, t0, time.Minute)
	if got := seqsOf(out, chat.Consumers); !slices.Equal(got, []int64{1}) || !held || c.recv != 1 {
		t.Fatalf("pushed %v held %v recv %d; want [1], held behind the unencodable seq 2, cursor at 1", got, held, c.recv)
	}
}

// skipDeleted moves a cursor over missing seqs only when they are at or
// below the origin's floor (deleted); above it a missing received seq is a
// gap (in flight), and a floor of 0 skips nothing.
func TestCursorSkipsDeletedSeqs(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		sent, recv           []int64
		sentFloor, recvFloor int64
		wantSent, wantRecv   int64
	}{
		{"nothing deleted", []int64{1, 2}, []int64{1}, 0, 0, 0, 0},
		{"a pruned prefix", []int64{6, 7}, []int64{4}, 5, 3, 5, 3},
		{"a gap above the floor stays a gap", nil, []int64{5}, 0, 3, 0, 0},
		{"deleted in the middle, up to the floor", []int64{8}, []int64{9}, 7, 8, 7, 8},
		{"no floor, no skip", []int64{6}, []int64{6}, 0, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c cursor
			c.skipDeleted(rows(chat.Workers, tc.sent...), rows(chat.Consumers, tc.recv...), tc.sentFloor, tc.recvFloor)
			if c.sent != tc.wantSent || c.recv != tc.wantRecv {
				t.Fatalf("cursor at sent %d, recv %d; want %d, %d", c.sent, c.recv, tc.wantSent, tc.wantRecv)
			}
		})
	}
}
