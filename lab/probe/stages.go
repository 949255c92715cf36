package probe

import (
	"slices"
	"time"
)

// Stages are the p50 durations of the three legs of a message's way, split
// at the timestamps its frame carries (both set by Postgres now(), the start
// of the transaction): send call start → sent_at (send tx begins), sent_at →
// received_at (send commit, wake-up, relay, queue, worker picks the job up
// and begins its inbox tx), received_at → frame at the client (inbox commit,
// NOTIFY, gateway read, WebSocket write).
type Stages struct {
	ToSendTx, SendToInboxTx, InboxTxToShown time.Duration
}

// StageSamples collects the legs of each shown message to compute Stages.
// The zero value is empty and ready; it is not safe for concurrent use.
type StageSamples struct{ a, b, c []time.Duration }

// Add records the legs of sh, whose send call started at t0; a message
// without both timestamps is skipped.
func (s *StageSamples) Add(t0 time.Time, sh Shown) {
	if sh.Message.ReceivedAt == nil || sh.Message.SentAt.IsZero() {
		return
	}
	s.a = append(s.a, sh.Message.SentAt.Sub(t0))
	s.b = append(s.b, sh.Message.ReceivedAt.Sub(sh.Message.SentAt))
	s.c = append(s.c, sh.At.Sub(*sh.Message.ReceivedAt))
}

// P50 returns the nearest-rank median of each leg (0 for a leg without
// samples). It sorts the samples in place.
func (s *StageSamples) P50() Stages {
	med := func(ds []time.Duration) time.Duration { slices.Sort(ds); return Percentile(ds, 0.5) }
	return Stages{med(s.a), med(s.b), med(s.c)}
}
