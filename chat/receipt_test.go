package chat

import (
	"errors"
	"testing"
)

func FuzzDecodeReceipt(f *testing.F) {
	f.Add([]byte(`{"id":"0b5c6f5e-5d2e-4b8a-9f53-1d2e3f4a5b6c","chats":[{"chat_id":3,"upto_seq":2}],"received_at":"2026-11-30T07:00:00.123456+00:00","from":"workers"}`))
	f.Add([]byte(`{"id":"x","chats":[{"chat_id":0,"upto_seq":-1}]}`))
	f.Add([]byte(`{"id":"0b5c6f5e-5d2e-4b8a-9f53-1d2e3f4a5b6c","chats":[],"received_at":"2026-11-30T07:00:00Z","from":"workers"}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := DecodeReceipt(data)
		if err != nil {
			if !errors.Is(err, ErrMalformedEvent) {
				t.Fatalf("error %v does not wrap ErrMalformedEvent", err)
			}
			return
		}
		if len(r.Chats) == 0 || Peer(r.From) == "" || len(r.ID) != 36 {
			t.Fatalf("accepted an invalid receipt %+v", r)
		}
		for _, c := range r.Chats {
			if c.ChatID <= 0 || c.UptoSeq <= 0 {
				t.Fatalf("accepted an invalid receipt %+v", r)
			}
		}
	})
}
