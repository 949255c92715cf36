package wakeup

import "testing"

// Wake-ups coalesce into one pending, and the loop that takes it finds
// every cause given before.
func TestWakeCoalesces(t *testing.T) {
	s := New()
	s.Wake(1)
	s.Wake(4)
	s.Wake(0)
	select {
	case <-s.C():
	default:
		t.Fatal("no wake-up pending after Wake")
	}
	select {
	case <-s.C():
		t.Fatal("a second wake-up pending: three Wake calls must coalesce into one")
	default:
	}
	if got := s.Take(); got != 5 {
		t.Fatalf("Take = %b, want 101", got)
	}
	if got := s.Take(); got != 0 {
		t.Fatalf("second Take = %b, want 0", got)
	}
	s.Wake(0)
	s.Drain()
	select {
	case <-s.C():
		t.Fatal("a wake-up pending after Drain")
	default:
	}
}
