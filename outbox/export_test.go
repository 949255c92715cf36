package outbox

import "time"

// Waiting returns the number of member passes waiting for the group's next
// pass.
func (g *RelayGroup) Waiting() int { return g.q.Waiting() }

// SetForgetCommittedAfter shortens how long w's Enqueues may go without a
// Committed before it warns.
func SetForgetCommittedAfter(w *Writer, d time.Duration) { w.forgetAfter = d }
