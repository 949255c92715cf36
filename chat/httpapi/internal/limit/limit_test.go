package limit

import "testing"

// A key's bucket empties after its burst; other keys keep their own.
func TestRateIsPerKey(t *testing.T) {
	r := NewRate(1, 2)
	for i := range 2 {
		if d := r.Reserve("a"); d != 0 {
			t.Fatalf("take %d of a: wait %v, want none", i+1, d)
		}
	}
	if d := r.Reserve("a"); d <= 0 {
		t.Fatal("third take of a: no wait, want one")
	}
	if d := r.Reserve("b"); d != 0 {
		t.Fatalf("first take of b: wait %v, want none", d)
	}
}

// The cap refuses one more at its maximum; a release (once, however often
// it is called) makes room again.
func TestCap(t *testing.T) {
	c := NewCap(1)
	release, ok := c.Take("u")
	if !ok {
		t.Fatal("first take refused")
	}
	if _, ok := c.Take("u"); ok {
		t.Fatal("second take allowed at the cap")
	}
	if _, ok := c.Take("v"); !ok {
		t.Fatal("another key refused")
	}
	release()
	release()
	if _, ok := c.Take("u"); !ok {
		t.Fatal("take after release refused")
	}
	if _, ok := c.Take("u"); ok {
		t.Fatal("a second release freed a second place")
	}
	if _, ok := NewCap(-1).Take("u"); !ok {
		t.Fatal("no cap refused")
	}
}
