package chat

import "sort"

// sortBySentAt orders messages of both origins by sent_at, keeping each
// origin's seq order for equal times.
func sortBySentAt(ms []Message) {
	sort.SliceStable(ms, func(i, j int) bool { return ms[i].SentAt.Before(ms[j].SentAt) })
}
