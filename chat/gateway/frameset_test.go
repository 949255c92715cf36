package gateway

import (
	"slices"
	"strconv"
	"testing"

	"github.com/outboxchat/outboxchat/chat"
)

// A frameSet finds every frame put in it, below and past the count it
// searches in order, and none it was not given (an id of the other origin
// is another message).
func TestFrameSet(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, frameSetFew, frameSetFew + 1, 3 * frameSetFew} {
		var fs frameSet
		for i := range n {
			fs.put(frameKey{"consumers", strconv.Itoa(i)}, []byte("c"+strconv.Itoa(i)), n)
		}
		for i := range n {
			if b, ok := fs.get(frameKey{"consumers", strconv.Itoa(i)}); !ok || string(b) != "c"+strconv.Itoa(i) {
				t.Fatalf("n=%d: frame %d = %q, %v", n, i, b, ok)
			}
			if b, ok := fs.get(frameKey{"workers", strconv.Itoa(i)}); ok || b != nil {
				t.Fatalf("n=%d: the other origin's id %d has frame %q", n, i, b)
			}
		}
		if b := fs.lookup(frameKey{"consumers", "none"}); b != nil {
			t.Fatalf("n=%d: unknown id has frame %q", n, b)
		}
	}
}

// A rowRun gives back exactly the rows added, in order, whether they are
// one run of the rows or not, and never lets an append write into rows.
func TestRowRun(t *testing.T) {
	t.Parallel()
	rows := make([]chat.Message, 6)
	for i := range rows {
		rows[i].Seq = int64(i + 1)
	}
	for _, add := range [][]int{nil, {0}, {2, 3, 4}, {0, 1, 2, 3, 4, 5}, {1, 3}, {0, 1, 4, 5}, {5}} {
		var r rowRun
		for _, i := range add {
			r.add(rows, i)
		}
		got := r.rows(rows)
		var seqs, want []int64
		for _, m := range got {
			seqs = append(seqs, m.Seq)
		}
		for _, i := range add {
			want = append(want, int64(i+1))
		}
		if !slices.Equal(seqs, want) {
			t.Fatalf("added %v: rows %v, want %v", add, seqs, want)
		}
		if cap(got) != len(got) {
			t.Fatalf("added %v: capacity %d past the %d rows", add, cap(got), len(got))
		}
		_ = append(got, chat.Message{Seq: 99})
		for i := range rows {
			if rows[i].Seq != int64(i+1) {
				t.Fatalf("added %v: an append changed row %d", add, i)
			}
		}
	}
}
