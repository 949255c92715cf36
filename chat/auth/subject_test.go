package auth

import (
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/internal/testenv"
)

// TestVerifyRefusesBadSubjectsAndFutureIssue: a validly signed token is
// still refused when its sub holds a NUL or a control character (Postgres
// refuses the one, logs and pages would show the other) or when its iat
// is further ahead than the issuer's clock skew (it would outlive a
// revocation of its user); an iat a little ahead passes.
func TestVerifyRefusesBadSubjectsAndFutureIssue(t *testing.T) {
	t.Parallel()
	f := testenv.WriteFile(t, "secret", benchSecret)
	v, err := NewVerifier(chat.Consumers, Config{SecretFile: f})
	if err != nil {
		t.Fatal(err)
	}
	mint := func(sub string, iat time.Time) string {
		tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
			"sub": sub, "chats": "*", "svc": chat.Consumers, "exp": time.Now().Add(time.Hour).Unix(), "iat": iat.Unix(),
		}).SignedString(benchSecret)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	now := time.Now()
	for name, tc := range map[string]struct {
		tok  string
		want string // "" = accepted
	}{
		"plain":               {mint("alice", now), ""},
		"iat 10 s ahead":      {mint("alice", now.Add(10*time.Second)), ""},
		"iat a day ahead":     {mint("alice", now.Add(24*time.Hour)), "iat"},
		"NUL in sub":          {mint("nul\x00user", now), "sub"},
		"escape in sub":       {mint("ctl\x1b[31m", now), "sub"},
		"non-ASCII sub is ok": {mint("zoë", now), ""},
	} {
		_, err := v.Verify(tc.tok)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: refused: %v", name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an error about %s", name, err, tc.want)
		}
	}
}
