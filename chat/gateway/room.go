package gateway

import (
	"slices"
	"time"

	"github.com/outboxchat/outboxchat/chat"
)

// cursor is one subscriber's position in a room: what it has been pushed
// of each origin, and the state of a gap in the received messages. It is
// pure logic (no database, no clock: the caller passes now), owned by the
// gateway goroutine; see room_test.go for its table.
//
// Sent messages (this service's own) are pushed in seq order, each exactly
// once: the cursor moves one seq at a time. Received messages (the other
// service's) may have a gap: a message still in flight, or reclaimed after
// a crash, while later ones are already in the inbox. The cursor holds the
// later ones for gapTimeout so that the room shows that side in seq order;
// after that it pushes them (remembered in above, so none is pushed twice)
// and pushes the missing one whenever it comes. Once maxAboveGap messages
// were pushed past a gap it gives up on it: the watermark moves to the
// highest seq pushed, and the missing message is then only in the history.
type cursor struct {
	sent, recv int64 // watermarks: every seq up to them was pushed
	// gapSince is when the current gap was first seen (zero: none).
	gapSince time.Time
	// above holds the received seqs pushed past a gap, beyond recv.
	above map[int64]bool
}

// cursorNote is something worth a log line that advance did.
type cursorNote struct {
	// pushedPast: the gap at missing was held for gapTimeout and next (the
	// first seq past it) is pushed now.
	pushedPast   bool
	missing      int64
	next         int64
	gaveUp       bool  // stopped waiting for the gap: watermark moved
	newWatermark int64 // for gaveUp
}

// cursorState is what a push compares before and after advance to tell
// whether the cursor moved (or started or stopped holding).
type cursorState struct {
	sent, recv int64
	above      int
	holding    bool
}

func (c *cursor) progress() cursorState {
	return cursorState{c.sent, c.recv, len(c.above), c.holding()}
}

// holding reports whether the cursor holds received messages behind a gap,
// or has pushed some past one (its watermark is below them).
func (c *cursor) holding() bool { return !c.gapSince.IsZero() || len(c.above) > 0 }

// takes reports whether the cursor can take these rows (each origin sorted
// by seq) without a read: each origin's first row is at or below its next
// seq, and no gap is held.
func (c *cursor) takes(sent, recv []chat.Message) bool {
	if c.holding() {
		return false
	}
	if len(sent) > 0 && sent[0].Seq > c.sent+1 {
		return false
	}
	if len(recv) > 0 && recv[0].Seq > c.recv+1 {
		return false
	}
	return true
}

// holdUntil is when a held gap's gapTimeout ends (zero when no gap is held
// or holds are off).
func (c *cursor) holdUntil(gapTimeout time.Duration) time.Time {
	if c.gapSince.IsZero() || gapTimeout <= 0 || len(c.above) > 0 {
		return time.Time{}
	}
	return c.gapSince.Add(gapTimeout)
}

// skipDeleted moves the cursor over seqs that were deleted, before advance
// looks at the rows (each origin sorted by seq): when an origin's first row
// the cursor has not seen is above its next seq and every seq in between is
// at or below that origin's floor (seqs up to the floor were all stored
// once), those seqs were deleted — pruned or removed by hand — not in
// flight, and waiting for them would stall the room for good (sent) or for
// a gap hold (received). A floor of 0 skips nothing.
func (c *cursor) skipDeleted(sent, recv []chat.Message, sentFloor, recvFloor int64) {
	for _, m := range sent {
		if m.Seq > c.sent {
			if m.Seq > c.sent+1 && m.Seq-1 <= sentFloor {
				c.sent = m.Seq - 1
			}
			break
		}
	}
	for _, m := range recv {
		if m.Seq <= c.recv || c.above[m.Seq] {
			continue
		}
		if m.Seq > c.recv+1 && m.Seq-1 <= recvFloor {
			c.recv = m.Seq - 1
			for q := range c.above {
				if q <= c.recv {
					delete(c.above, q)
				}
			}
			if len(c.above) == 0 {
				c.gapSince = time.Time{}
			}
		}
		break
	}
}

// advance moves the cursor over the rows (each origin sorted by seq, no
// repeats) and returns what to push, in push order (merged by sent_at; each
// origin in seq order), whether received rows are held back behind a gap,
// and notes for the log. gapTimeout ≤ 0 means no hold.
func (c *cursor) advance(sent, recv []chat.Message, now time.Time, gapTimeout time.Duration) (out []chat.Message, held bool, notes []cursorNote) {
	// What is pushed of each origin is usually one run of its rows, in
	// order: it is then a subslice of them (read-only, shared by the
	// room's subscribers), not a copy per subscriber and push.
	var outSent, outRecv rowRun
	for i, m := range sent {
		if m.Seq == c.sent+1 {
			outSent.add(sent, i)
			c.sent = m.Seq
		}
	}
	for i, m := range recv {
		if m.Seq <= c.recv || c.above[m.Seq] {
			continue // seen: at or below the watermark, or pushed past a gap
		}
		if m.Seq == c.recv+1 {
			outRecv.add(recv, i)
			c.recv = m.Seq
			// A late message may close a gap that was given up on: move the
			// watermark over what was already pushed above it.
			for c.above[c.recv+1] {
				delete(c.above, c.recv+1)
				c.recv++
			}
			if len(c.above) == 0 {
				c.gapSince = time.Time{}
			}
			continue
		}
		// A gap: hold the later ones up to gapTimeout; after that push
		// them, and push the missing one whenever it comes (the watermark
		// stays below it, so it is still read).
		held = true
		if c.gapSince.IsZero() {
			c.gapSince = now
		}
		if gapTimeout > 0 && now.Sub(c.gapSince) < gapTimeout {
			break
		}
		if len(c.above) == 0 && gapTimeout > 0 {
			notes = append(notes, cursorNote{pushedPast: true, missing: c.recv + 1, next: m.Seq})
		}
		if c.above == nil {
			c.above = map[int64]bool{}
		}
		outRecv.add(recv, i)
		c.above[m.Seq] = true
		if len(c.above) >= maxAboveGap {
			// Too far past the gap to keep re-reading: move the watermark
			// to the highest seq pushed; a message below it that comes
			// later is in the history, not pushed live.
			for q := range c.above {
				c.recv = max(c.recv, q)
			}
			clear(c.above)
			c.gapSince = time.Time{}
			notes = append(notes, cursorNote{gaveUp: true, newWatermark: c.recv})
		}
	}
	// Usually one origin only (a push of received rows): no merge, no copy.
	pushSent, pushRecv := outSent.rows(sent), outRecv.rows(recv)
	switch {
	case len(pushSent) == 0:
		return pushRecv, held, notes
	case len(pushRecv) == 0:
		return pushSent, held, notes
	}
	return chat.MergeBySentAt(pushSent, pushRecv), held, notes
}

// rowRun collects rows of one origin that advance pushes, by index in
// order: while they are consecutive rows it only keeps the bounds, and
// copies them once one is skipped.
type rowRun struct {
	from, to int            // rows[from:to], while copied is nil
	copied   []chat.Message // the rows, once they are not one run
}

// add adds rows[i]; i is above every index added before.
func (r *rowRun) add(rows []chat.Message, i int) {
	switch {
	case r.copied != nil:
		r.copied = append(r.copied, rows[i])
	case r.from == r.to:
		r.from, r.to = i, i+1
	case r.to == i:
		r.to++
	default:
		r.copied = append(slices.Clone(rows[r.from:r.to]), rows[i])
	}
}

// rows returns the rows added, of rows; their capacity ends at their
// length, so that an append copies instead of overwriting rows.
func (r *rowRun) rows(rows []chat.Message) []chat.Message {
	if r.copied != nil {
		return r.copied
	}
	return rows[r.from:r.to:r.to]
}
