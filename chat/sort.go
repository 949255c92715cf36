package chat

// mergeBySentAt merges this service's own messages and the received ones,
// each already in seq order, into one list ordered by sent_at, without ever
// reordering messages of one origin: sent_at is the sending transaction's
// start time, which need not grow with seq.
func MergeBySentAt(a, b []Message) []Message {
	out := make([]Message, 0, len(a)+len(b))
	for len(a) > 0 && len(b) > 0 {
		if b[0].SentAt.Before(a[0].SentAt) {
			out, b = append(out, b[0]), b[1:]
		} else {
			out, a = append(out, a[0]), a[1:]
		}
	}
	return append(append(out, a...), b...)
}
