package auth

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Revocation kinds: what Revocation.Value names (the revoked_tokens.kind
// column).
const (
	// RevokeUser revokes every token of a user (sub) issued (iat) at or
	// before RevokedAt, and every one of theirs without iat.
	RevokeUser = "user"
	// RevokeToken revokes one token by its id (jti).
	RevokeToken = "token"
)

// ErrRevoked is wrapped by Verify's error for a token that was revoked.
var ErrRevoked = errors.New("token revoked")

// Revocation is one revoked user or token.
type Revocation struct {
	// Kind is RevokeUser or RevokeToken; other kinds are ignored.
	Kind string
	// Value is the user (Kind RevokeUser) or the token id (RevokeToken).
	Value string
	// RevokedAt is when it was revoked (database clock); for a user,
	// tokens issued after it pass.
	RevokedAt time.Time
}

// Revocations is the set of revoked users and tokens a Verifier refuses
// (every Verifier has one: Verifier.Revocations). It is filled by the
// caller (the server polls its revoked_tokens table) and read on every
// request: Revoked is one atomic load and at most two map lookups, with no
// lock and no allocation, so the hot path pays next to nothing. Writers
// replace the set copy-on-write. The zero value is not ready: use
// NewRevocations. Safe for concurrent use.
type Revocations struct {
	set atomic.Pointer[revocationSet]

	mu      sync.Mutex    // serialises Add; guards changed
	changed chan struct{} // closed and replaced by each Add that changed the set
}

type revocationSet struct {
	users  map[string]time.Time // user → revoked at
	tokens map[string]struct{}  // token id
}

// NewRevocations returns an empty set.
func NewRevocations() *Revocations {
	r := &Revocations{changed: make(chan struct{})}
	r.set.Store(&revocationSet{users: map[string]time.Time{}, tokens: map[string]struct{}{}})
	return r
}

// Add merges rs into the set (a user revoked again keeps the later
// RevokedAt) and, when that changed anything, wakes every Changed waiter.
func (r *Revocations) Add(rs ...Revocation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.set.Load()
	next := &revocationSet{users: old.users, tokens: old.tokens}
	copied := false
	cow := func() {
		if !copied {
			next.users = make(map[string]time.Time, len(old.users)+1)
			for k, v := range old.users {
				next.users[k] = v
			}
			next.tokens = make(map[string]struct{}, len(old.tokens)+1)
			for k := range old.tokens {
				next.tokens[k] = struct{}{}
			}
			copied = true
		}
	}
	for _, rv := range rs {
		switch rv.Kind {
		case RevokeUser:
			if at, ok := next.users[rv.Value]; !ok || rv.RevokedAt.After(at) {
				cow()
				next.users[rv.Value] = rv.RevokedAt
			}
		case RevokeToken:
			if _, ok := next.tokens[rv.Value]; !ok {
				cow()
				next.tokens[rv.Value] = struct{}{}
			}
		}
	}
	if !copied {
		return
	}
	r.set.Store(next)
	close(r.changed)
	r.changed = make(chan struct{})
}

// Revoked reports whether p's token is refused: its id is revoked, or its
// user is, and it was issued at or before that (or has no iat).
func (r *Revocations) Revoked(p *Principal) bool {
	s := r.set.Load()
	if len(s.users) == 0 && len(s.tokens) == 0 {
		return false
	}
	if p.TokenID != "" {
		if _, ok := s.tokens[p.TokenID]; ok {
			return true
		}
	}
	if at, ok := s.users[p.User]; ok && (p.IssuedAt.IsZero() || !p.IssuedAt.After(at)) {
		return true
	}
	return false
}

// Changed returns a channel closed at the next Add that changes the set
// (then call Changed again for the one after).
func (r *Revocations) Changed() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.changed
}

// Len returns how many users and tokens are revoked.
func (r *Revocations) Len() int {
	s := r.set.Load()
	return len(s.users) + len(s.tokens)
}
