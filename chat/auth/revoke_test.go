package auth

import (
	"testing"
	"time"
)

func TestRevocations(t *testing.T) {
	r := NewRevocations()
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	before := &Principal{User: "alice", TokenID: "a1", IssuedAt: t0.Add(-time.Minute)}
	same := &Principal{User: "alice", TokenID: "a2", IssuedAt: t0}
	after := &Principal{User: "alice", TokenID: "a3", IssuedAt: t0.Add(time.Second)}
	noIat := &Principal{User: "alice"}
	bob := &Principal{User: "bob", TokenID: "b1", IssuedAt: t0}
	for _, p := range []*Principal{before, same, after, noIat, bob} {
		if r.Revoked(p) {
			t.Fatalf("%+v revoked in an empty set", p)
		}
	}
	changed := r.Changed()
	r.Add(Revocation{Kind: RevokeUser, Value: "alice", RevokedAt: t0})
	select {
	case <-changed:
	default:
		t.Fatal("Add did not wake Changed")
	}
	for p, want := range map[*Principal]bool{before: true, same: true, after: false, noIat: true, bob: false} {
		if got := r.Revoked(p); got != want {
			t.Errorf("user revoked at t0: %+v revoked %v, want %v", p, got, want)
		}
	}
	// Nothing new (an older revocation of alice, an unknown kind): no wake.
	changed = r.Changed()
	r.Add(Revocation{Kind: RevokeUser, Value: "alice", RevokedAt: t0.Add(-time.Hour)}, Revocation{Kind: "other", Value: "x"})
	select {
	case <-changed:
		t.Fatal("an Add that changed nothing woke Changed")
	default:
	}
	if r.Revoked(after) {
		t.Fatal("an older revocation moved the cut-off back")
	}
	r.Add(Revocation{Kind: RevokeToken, Value: "b1"}, Revocation{Kind: RevokeUser, Value: "alice", RevokedAt: t0.Add(time.Minute)})
	if !r.Revoked(bob) || !r.Revoked(after) || r.Len() != 2 {
		t.Fatalf("after revoking token b1 and alice again: bob %v, alice's later token %v, len %d", r.Revoked(bob), r.Revoked(after), r.Len())
	}
	if r.Revoked(&Principal{User: "bob", TokenID: "b2", IssuedAt: t0}) {
		t.Fatal("bob's other token revoked")
	}
}
