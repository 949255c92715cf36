package claimfloor

import (
	"testing"
	"time"
)

// The floor's bookkeeping without a database: a pair (V, R) is started only
// by a pass that read its xid, and the floor passes V only once a later
// pass's xmin is at least R (every transaction that may hold an id ≤ V has
// ended); a full claim moves it only past its last id.
func TestAdvance(t *testing.T) {
	var f Floor
	now := time.Now()
	if from, want := f.Start(now); from != 0 || !want {
		t.Fatalf("first start = %d, %v; want a full scan that asks for the xid", from, want)
	}
	f.Advance(0, 50, 90, 0, false, 0) // an empty pass: no xid, no pair
	if from, want := f.Start(now); from != 0 || !want {
		t.Fatalf("after an empty pass: %d, %v; want floor 0 and no pair yet", from, want)
	}
	f.Advance(0, 50, 90, 100, false, 50) // claimed, xid 100: pair (50, 100)
	if _, want := f.Start(now); want {
		t.Fatal("a pair is pending: the next pass need not read its xid")
	}
	f.Advance(0, 60, 100, 0, false, 0) // xmin 100 ≥ R 100: ids ≤ 50 are over
	if from, _ := f.Start(now); from != 51 {
		t.Fatalf("floor %d, want 51", from)
	}
	f.Advance(51, 80, 120, 130, false, 80) // pair (80, 130)
	f.Advance(51, 90, 129, 0, false, 0)    // xmin 129 < 130: a transaction that may hold an id ≤ 80 runs
	if from, _ := f.Start(now); from != 51 {
		t.Fatalf("floor %d moved while a transaction below R ran, want 51", from)
	}
	f.Advance(51, 90, 131, 0, false, 0) // now it has ended
	if from, _ := f.Start(now); from != 81 {
		t.Fatalf("floor %d, want 81", from)
	}
	f.Advance(81, 200, 140, 150, true, 180) // pair (200, 150); a full claim up to 180
	f.Advance(81, 300, 151, 0, true, 190)   // checks the pair: a full claim only published up to 190
	if from, _ := f.Start(now); from != 191 {
		t.Fatalf("floor %d after a full claim, want 191", from)
	}
	if from, _ := f.Start(now.Add(RescanEvery + time.Second)); from != 0 {
		t.Fatalf("start after %v = %d, want the full scan", RescanEvery, from)
	}
}
