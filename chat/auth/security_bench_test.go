package auth

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/redisq"
)

// BenchmarkVerifyToken is the API's per-request auth cost: one HS256
// bearer token checked (signature, exp, svc), the first time ("cold":
// parsed and its HMAC computed) and again ("cached": a client's next
// request with the same token).
func BenchmarkVerifyToken(b *testing.B) {
	f := testenv.WriteFile(b, "secret", benchSecret)
	v, err := NewVerifier(chat.Consumers, Config{SecretFile: f})
	if err != nil {
		b.Fatal(err)
	}
	tok, err := MintToken(benchSecret, "alice", []string{chat.Consumers, chat.Workers}, ChatScope{IDs: []int64{1, 2, 3}}, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("cold", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			v.mu.Lock()
			clear(v.verified)
			v.mu.Unlock()
			if _, err := v.Verify(tok); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cached", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := v.Verify(tok); err != nil {
				b.Fatal(err)
			}
		}
	})
	// The same with 1,000 other users and 1,000 token ids revoked: the
	// revocation check stays two map lookups.
	for i := range 1000 {
		v.Revocations().Add(Revocation{Kind: RevokeUser, Value: fmt.Sprint("user-", i), RevokedAt: time.Now()},
			Revocation{Kind: RevokeToken, Value: fmt.Sprint("token-", i)})
	}
	b.Run("cached_revocations", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := v.Verify(tok); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkSignVerifyEvent is the per-message cost of signed events: the
// relay's HMAC-SHA256 over one entry and the receiver's check, for a
// typical 200-byte payload.
func BenchmarkSignVerifyEvent(b *testing.B) {
	keys, err := ReadEventKeys(writeEventKeysB(b))
	if err != nil {
		b.Fatal(err)
	}
	payload := make([]byte, 200)
	job := redisq.Job{ID: uuid.NewString(), Name: chat.EventMessageCreated, Payload: payload}
	sign := keys.Signer(chat.QueueName(chat.Consumers))
	b.ReportAllocs()
	for b.Loop() {
		sig := sign(job)
		if err := keys.Verify(chat.QueueName(chat.Consumers), inbox.Delivery{ID: job.ID, Name: job.Name, Payload: job.Payload, Sig: sig}); err != nil {
			b.Fatal(err)
		}
	}
}

func writeEventKeysB(b testing.TB) string {
	return testenv.WriteFile(b, "event.keys", []byte("consumers-to-workers "+benchHexKey(1)+"\nworkers-to-consumers "+benchHexKey(2)+"\n"))
}

var benchSecret = []byte("outboxchat bench secret: 32 bytes or more")

func benchHexKey(b byte) string { return strings.Repeat(fmt.Sprintf("%02x", b), 32) }
