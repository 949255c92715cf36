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
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/outboxchat/outboxchat/chat"

	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/redisq"
)

// EventKeys are the HMAC-SHA256 keys that sign stream entries, per
// direction (QueueName: "consumers-to-workers", "workers-to-consumers").
// The first key of a direction signs; every key of it (at most two, for
// rotation) verifies. Safe for concurrent use once built.
type EventKeys struct {
	keys map[string][][]byte // queue → keys, signing key first
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
	k := &EventKeys{keys: map[string][][]byte{}}
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
		k.keys[dir] = append(k.keys[dir], key)
	}
	for _, dir := range []string{chat.QueueName(chat.Consumers), chat.QueueName(chat.Workers)} {
		if len(k.keys[dir]) == 0 {
			return nil, fmt.Errorf("event keys %s: no key for %s", path, dir)
		}
	}
	return k, nil
}

// eventMAC is the HMAC-SHA256 of an entry's fields under key.
func eventMAC(key []byte, id, name string, payload []byte, headers map[string]string) []byte {
	m := hmac.New(sha256.New, key)
	var n [4]byte
	for _, f := range [][]byte{[]byte(id), []byte(name), payload} {
		binary.BigEndian.PutUint32(n[:], uint32(len(f)))
		m.Write(n[:])
		m.Write(f)
	}
	if len(headers) > 0 {
		var h []byte
		for _, k := range slices.Sorted(maps.Keys(headers)) {
			h = binary.BigEndian.AppendUint32(h, uint32(len(k)))
			h = append(h, k...)
			h = binary.BigEndian.AppendUint32(h, uint32(len(headers[k])))
			h = append(h, headers[k]...)
		}
		binary.BigEndian.PutUint32(n[:], uint32(len(h)))
		m.Write(n[:])
		m.Write(h)
	}
	return m.Sum(nil)
}

// Signer returns the redisq.PublisherConfig.Sign of queue (the direction a
// service publishes to). It signs the job's id, name, payload and headers.
func (k *EventKeys) Signer(queue string) func(redisq.Job) string {
	key := k.keys[queue][0]
	return func(j redisq.Job) string {
		return sigPrefix + hex.EncodeToString(eventMAC(key, j.ID, j.Name, j.Payload, j.Headers))
	}
}

// Verify checks d's signature (over its id, name, payload and headers)
// against queue's keys: nil, or an error wrapping ErrUnsigned or ErrForged. Constant time in the signature.
func (k *EventKeys) Verify(queue string, d inbox.Delivery) error {
	if d.Sig == "" {
		return ErrUnsigned
	}
	got, err := hex.DecodeString(strings.TrimPrefix(d.Sig, sigPrefix))
	if err != nil || !strings.HasPrefix(d.Sig, sigPrefix) {
		return ErrForged
	}
	for _, key := range k.keys[queue] {
		if hmac.Equal(got, eventMAC(key, d.ID, d.Name, d.Payload, d.Headers)) {
			return nil
		}
	}
	return ErrForged
}
