package auth_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/auth"
	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/redisq"
)

// TestSignatureCoversHeaders: a signed entry's headers are covered (adding,
// dropping or changing one is a forgery), and an entry without headers is
// signed exactly as before headers existed, so entries already in a stream
// still verify.
func TestSignatureCoversHeaders(t *testing.T) {
	t.Parallel()
	key := strings.Repeat("ab", 32)
	path := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(path, []byte("consumers-to-workers "+key+"\nworkers-to-consumers "+strings.Repeat("cd", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	keys, err := auth.ReadEventKeys(path)
	if err != nil {
		t.Fatal(err)
	}
	q := chat.QueueName(chat.Consumers)
	job := redisq.Job{ID: "id-1", Name: chat.EventMessageCreated, Payload: []byte(`{"x":1}`)}
	delivery := func(j redisq.Job, sig string) inbox.Delivery {
		return inbox.Delivery{ID: j.ID, Name: j.Name, Payload: j.Payload, Headers: j.Headers, Sig: sig}
	}

	// The scheme as it was before headers: id, name, payload, each after
	// its 4-byte length.
	raw, _ := hex.DecodeString(key)
	m := hmac.New(sha256.New, raw)
	for _, f := range []string{job.ID, job.Name, string(job.Payload)} {
		m.Write(binary.BigEndian.AppendUint32(nil, uint32(len(f))))
		m.Write([]byte(f))
	}
	old := "v1=" + hex.EncodeToString(m.Sum(nil))
	if got := keys.Signer(q)(job); got != old {
		t.Fatalf("a job without headers signs as %s, before headers it was %s", got, old)
	}
	if err := keys.Verify(q, delivery(job, old)); err != nil {
		t.Fatalf("an entry signed before headers existed: %v", err)
	}

	withH := job
	withH.Headers = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tenant": "acme"}
	sig := keys.Signer(q)(withH)
	if sig == old {
		t.Fatal("headers do not change the signature")
	}
	if err := keys.Verify(q, delivery(withH, sig)); err != nil {
		t.Fatalf("signed with headers: %v", err)
	}
	for name, h := range map[string]map[string]string{
		"headers dropped": nil,
		"header changed":  {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203332-01", "tenant": "acme"},
		"header added":    {"traceparent": withH.Headers["traceparent"], "tenant": "acme", "x": ""},
		"key and value moved across the boundary": {"traceparent": withH.Headers["traceparent"], "tenan": "tacme"},
	} {
		forged := withH
		forged.Headers = h
		if err := keys.Verify(q, delivery(forged, sig)); !errors.Is(err, auth.ErrForged) {
			t.Errorf("%s: %v, want ErrForged", name, err)
		}
	}
	added := job
	added.Headers = map[string]string{"tenant": "evil"}
	if err := keys.Verify(q, delivery(added, old)); !errors.Is(err, auth.ErrForged) {
		t.Errorf("headers added to an entry signed without: %v, want ErrForged", err)
	}
}
