package redisglob_test

import (
	"testing"

	"github.com/outboxchat/outboxchat/internal/redisglob"
)

func TestKeyRule(t *testing.T) {
	t.Parallel()
	for k, want := range map[string]string{
		"p:q:{a}:stream":  "~p:q:{a}:stream",
		"p:q:{a}:dedupe*": "~p:q:{a}:dedupe*",
		"x*y?[z]\\":       `~x\*y\?\[z\]\\`,
		"a**":             `~a\**`,
	} {
		if got := redisglob.KeyRule(k); got != want {
			t.Errorf("KeyRule(%q) = %q, want %q", k, got, want)
		}
	}
}
