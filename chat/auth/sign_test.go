package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"sync"
	"testing"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/redisq"
)

// The pooled signer gives the scheme's signature (HMAC-SHA256 over the
// length-prefixed id, name and payload, hex, "v1=" prefix), from many
// goroutines at once, and Verify takes exactly it.
func TestSignatureScheme(t *testing.T) {
	keys, err := ReadEventKeys(writeEventKeysB(t))
	if err != nil {
		t.Fatal(err)
	}
	q := chat.QueueName(chat.Consumers)
	key, _ := hex.DecodeString(benchHexKey(1))
	want := func(id, name string, payload []byte) string {
		m := hmac.New(sha256.New, key)
		for _, f := range [][]byte{[]byte(id), []byte(name), payload} {
			m.Write(binary.BigEndian.AppendUint32(nil, uint32(len(f))))
			m.Write(f)
		}
		return "v1=" + hex.EncodeToString(m.Sum(nil))
	}
	sign := keys.Signer(q)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				j := redisq.Job{ID: string(rune('a' + g)), Name: chat.EventMessageCreated, Payload: make([]byte, i)}
				if got, w := sign(j), want(j.ID, j.Name, j.Payload); got != w {
					errs <- errors.New("signature " + got + ", want " + w)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	d := inbox.Delivery{ID: "id", Name: chat.EventMessageCreated, Payload: []byte(`{"x":1}`)}
	d.Sig = want(d.ID, d.Name, d.Payload)
	if err := keys.Verify(q, d); err != nil {
		t.Fatalf("Verify of a good signature: %v", err)
	}
	for name, bad := range map[string]inbox.Delivery{
		"other payload": {ID: d.ID, Name: d.Name, Payload: []byte(`{"x":2}`), Sig: d.Sig},
		"field moved":   {ID: d.ID + "m", Name: d.Name[1:], Payload: d.Payload, Sig: d.Sig},
		"short":         {ID: d.ID, Name: d.Name, Payload: d.Payload, Sig: d.Sig[:len(d.Sig)-2]},
		"no prefix":     {ID: d.ID, Name: d.Name, Payload: d.Payload, Sig: d.Sig[3:]},
		"not hex":       {ID: d.ID, Name: d.Name, Payload: d.Payload, Sig: d.Sig[:len(d.Sig)-1] + "z"},
	} {
		if err := keys.Verify(q, bad); !errors.Is(err, ErrForged) {
			t.Errorf("%s: Verify = %v, want ErrForged", name, err)
		}
	}
	if err := keys.Verify(chat.QueueName(chat.Workers), d); !errors.Is(err, ErrForged) {
		t.Errorf("the other direction's key accepted the signature: %v", err)
	}
}
