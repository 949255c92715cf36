package gateway

import (
	"strconv"
	"testing"
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
