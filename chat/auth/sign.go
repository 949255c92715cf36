package auth

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/outboxchat/outboxchat/chat"

	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/redisq"
)

// EventKeys are the HMAC-SHA256 keys that sign stream entries, per
// direction (QueueName: "consumers-to-workers", "workers-to-consumers").
// The first key of a direction signs; every key of it (at most two, for
// rotation) verifies. Safe for concurrent use once built.
type EventKeys struct {
	keys map[string][]*eventKey // queue → keys, signing key first
}

// eventKey is one key with a pool of HMAC states keyed with it: hmac.New
// (two SHA-256 states and the padded key) per entry cost more than the
// MAC itself; a pooled state is Reset instead.
type eventKey struct {
	key  []byte
	pool sync.Pool // of *macState
}

// macState is one pooled HMAC with scratch room for the encoded fields
// and the sum.
type macState struct {
	h   hash.Hash
	buf []byte
	len [4]byte
	sum [sha256.Size]byte
}

func newEventKey(key []byte) *eventKey {
	k := &eventKey{key: key}
	k.pool.New = func() any { return &macState{h: hmac.New(sha256.New, key)} }
	return k
}

// Signature scheme: "v1=" + hex(HMAC-SHA256(key, fields)), fields being the
// entry's id, name and payload, each preceded by its length as a 4-byte
// big-endian integer (so no two field lists encode alike), and, only when
// the entry has headers, a fourth field: the headers in key order, each key
// and value preceded by its length likewise. An entry without headers signs
// exactly as before headers existed, so entries already in a stream (and
// dead letters) still verify; adding, removing or changing a header of a
// signed entry breaks its signature (three fields cannot encode like four:
// the payload's length prefix says where the input ends).
const sigPrefix = "v1="

// minEventKeyBytes is the shortest key accepted: RFC 2104 §3 advises keys
// no shorter than the hash output (32 bytes for SHA-256).
const minEventKeyBytes = 32

// ErrUnsigned and ErrForged are the reasons an entry is dead-lettered when
// event keys are set (wrapped in inbox.ErrMalformed).
var (
	ErrUnsigned = errors.New("unsigned stream entry")
	ErrForged   = errors.New("forged stream entry: signature does not match")
)

// ReadEventKeys reads an event key file: one key per line,
//
//	<direction> <hex key>
//
// direction being "consumers-to-workers" or "workers-to-consumers", the key
// at least 32 bytes (64 hex digits). A direction has one or two lines: the
// first signs, both verify (rotate by adding the new key second on the
// receivers, then moving it first everywhere, then dropping the old one).
// Blank lines and lines starting with # are skipped.
func ReadEventKeys(path string) (*EventKeys, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("event keys: %w", err)
	}
	k := &EventKeys{keys: map[string][]*eventKey{}}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		dir, hexKey, ok := strings.Cut(line, " ")
		if !ok || (dir != chat.QueueName(chat.Consumers) && dir != chat.QueueName(chat.Workers)) {
			return nil, fmt.Errorf("event keys %s:%d: want \"<consumers-to-workers|workers-to-consumers> <hex key>\"", path, n)
		}
		key, err := hex.DecodeString(strings.TrimSpace(hexKey))
		if err != nil || len(key) < minEventKeyBytes {
			return nil, fmt.Errorf("event keys %s:%d: key must be at least %d bytes of hex", path, n, minEventKeyBytes)
		}
		if len(k.keys[dir]) == 2 {
			return nil, fmt.Errorf("event keys %s:%d: at most two keys per direction", path, n)
		}
		k.keys[dir] = append(k.keys[dir], newEventKey(key))
	}
	for _, dir := range []string{chat.QueueName(chat.Consumers), chat.QueueName(chat.Workers)} {
		if len(k.keys[dir]) == 0 {
			return nil, fmt.Errorf("event keys %s: no key for %s", path, dir)
		}
	}
	return k, nil
}

// mac computes the HMAC-SHA256 of an entry's fields (and headers, when
// it has any) under k into st.sum, st being a state from k's pool (the
// caller puts it back).
func (k *eventKey) mac(st *macState, id, name string, payload []byte, headers map[string]string) []byte {
	b := st.buf[:0]
	for _, f := range [][]byte{[]byte(id), []byte(name)} {
		b = binary.BigEndian.AppendUint32(b, uint32(len(f)))
		b = append(b, f...)
	}
	b = binary.BigEndian.AppendUint32(b, uint32(len(payload)))
	st.h.Reset()
	st.h.Write(b)
	st.h.Write(payload)
	if len(headers) > 0 {
		h := b[:0]
		for _, key := range slices.Sorted(maps.Keys(headers)) {
			h = binary.BigEndian.AppendUint32(h, uint32(len(key)))
			h = append(h, key...)
			h = binary.BigEndian.AppendUint32(h, uint32(len(headers[key])))
			h = append(h, headers[key]...)
		}
		st.h.Write(binary.BigEndian.AppendUint32(st.len[:0], uint32(len(h))))
		st.h.Write(h)
		b = h
	}
	st.buf = b
	return st.h.Sum(st.sum[:0])
}

// Signer returns the redisq.PublisherConfig.Sign of queue (the direction a
// service publishes to). It signs the job's id, name, payload and headers.
func (k *EventKeys) Signer(queue string) func(redisq.Job) string {
	key := k.keys[queue][0]
	return func(j redisq.Job) string {
		st := key.pool.Get().(*macState)
		sum := key.mac(st, j.ID, j.Name, j.Payload, j.Headers)
		var out [len(sigPrefix) + 2*sha256.Size]byte
		copy(out[:], sigPrefix)
		hex.Encode(out[len(sigPrefix):], sum)
		key.pool.Put(st)
		return string(out[:])
	}
}

// Verify checks d's signature against queue's keys: nil, or an error
// wrapping ErrUnsigned or ErrForged. Constant time in the signature.
func (k *EventKeys) Verify(queue string, d inbox.Delivery) error {
	if d.Sig == "" {
		return ErrUnsigned
	}
	hexSig, ok := strings.CutPrefix(d.Sig, sigPrefix)
	var got [sha256.Size]byte
	if !ok || len(hexSig) != 2*sha256.Size {
		return ErrForged
	}
	if _, err := hex.Decode(got[:], []byte(hexSig)); err != nil {
		return ErrForged
	}
	for _, key := range k.keys[queue] {
		st := key.pool.Get().(*macState)
		match := hmac.Equal(got[:], key.mac(st, d.ID, d.Name, d.Payload, d.Headers))
		key.pool.Put(st)
		if match {
			return nil
		}
	}
	return ErrForged
}
