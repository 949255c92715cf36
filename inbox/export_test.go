package inbox

// Waiting returns the number of member batches waiting for the Group's
// next transaction.
func (g *Group) Waiting() int { return g.q.Waiting() }
