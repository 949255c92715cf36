package outbox

// Waiting returns the number of member passes waiting for the group's next
// pass.
func (g *RelayGroup) Waiting() int { return g.q.Waiting() }
