// Package wakeup is a coalescing wake-up for a loop that runs work on
// demand (the relay's passes, the Writer's notifies): any number of Wake
// calls leave at most one wake-up pending, and the loop that takes it
// learns every cause given since it last looked.
package wakeup

import "sync/atomic"

// Signal is one loop's wake-up. Make it with New. Wake is safe for
// concurrent use and never blocks; C, Take and Drain belong to the loop.
type Signal struct {
	ch     chan struct{} // 1-buffered: a wake-up is pending
	causes atomic.Uint32
}

// New returns a Signal with nothing pending.
func New() *Signal { return &Signal{ch: make(chan struct{}, 1)} }

// Wake records cause (bits of the caller's own meaning; 0 for none) and
// leaves one wake-up pending unless one is. The bits are recorded before
// the wake-up is left, so the loop that takes the wake-up finds them.
func (s *Signal) Wake(cause uint32) {
	if cause != 0 {
		s.causes.Or(cause)
	}
	select {
	case s.ch <- struct{}{}:
	default:
	}
}

// C returns the channel the pending wake-up is taken from.
func (s *Signal) C() <-chan struct{} { return s.ch }

// Take returns the causes recorded since the last Take and clears them.
func (s *Signal) Take() uint32 { return s.causes.Swap(0) }

// Drain takes the pending wake-up, if there is one, without waiting: for a
// loop about to do what it would ask for anyway.
func (s *Signal) Drain() {
	select {
	case <-s.ch:
	default:
	}
}
