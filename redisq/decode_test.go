package redisq

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestDecodeEntry(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		values map[string]any
		want   Job
		bad    bool
	}{
		{"complete", map[string]any{"id": "a", "name": "n", "payload": "{}"}, Job{ID: "a", Name: "n", Payload: []byte("{}")}, false},
		{"empty payload", map[string]any{"id": "a", "name": "n", "payload": ""}, Job{ID: "a", Name: "n", Payload: []byte{}}, false},
		{"extra field", map[string]any{"id": "a", "name": "n", "payload": "p", "x": "y"}, Job{ID: "a", Name: "n", Payload: []byte("p")}, false},
		{"no id", map[string]any{"name": "n", "payload": "p"}, Job{Name: "n", Payload: []byte("p")}, true},
		{"empty id", map[string]any{"id": "", "name": "n", "payload": "p"}, Job{Name: "n", Payload: []byte("p")}, true},
		{"no payload", map[string]any{"id": "a", "name": "n"}, Job{ID: "a", Name: "n"}, true},
		{"no name", map[string]any{"id": "a", "payload": "p"}, Job{ID: "a", Payload: []byte("p")}, true},
		{"non-string", map[string]any{"id": 7, "name": "n", "payload": "p"}, Job{Name: "n", Payload: []byte("p")}, true},
		{"garbage", map[string]any{"foo": "bar"}, Job{}, true},
		{"nothing", map[string]any{}, Job{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := decodeEntry("1-0", tc.values)
			if d.StreamID != "1-0" || d.Deliveries != 1 {
				t.Fatalf("StreamID %q Deliveries %d", d.StreamID, d.Deliveries)
			}
			if d.ID != tc.want.ID || d.Name != tc.want.Name || string(d.Payload) != string(tc.want.Payload) ||
				(d.Payload == nil) != (tc.want.Payload == nil) {
				t.Fatalf("job %+v, want %+v", d.Job, tc.want)
			}
			if got := errors.Is(d.Err, ErrMalformedEntry); got != tc.bad {
				t.Fatalf("Err = %v, malformed want %v", d.Err, tc.bad)
			}
		})
	}
}

func FuzzDecodeEntry(f *testing.F) {
	f.Add("id", "a", "name", "n", "payload", "{}")
	f.Add("id", "", "x", "y", "payload", "\x00")
	f.Add("", "", "", "", "", "")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, k3, v3 string) {
		values := map[string]any{k1: v1, k2: v2, k3: v3}
		d := decodeEntry("5-5", values)
		if d.StreamID != "5-5" {
			t.Fatal("stream id lost")
		}
		if d.Err == nil {
			if d.ID == "" || d.ID != values["id"] || d.Name != values["name"] || string(d.Payload) != values["payload"] {
				t.Fatalf("well-formed decode %+v of %v", d, values)
			}
		} else if !errors.Is(d.Err, ErrMalformedEntry) {
			t.Fatalf("Err %v does not wrap ErrMalformedEntry", d.Err)
		}
	})
}

func TestKeys(t *testing.T) {
	t.Parallel()
	k := NewKeys("p:", "chat")
	for got, want := range map[string]string{
		k.Stream:       "p:q:{chat}:stream",
		k.Dead:         "p:q:{chat}:dead",
		k.Dedupe:       "p:q:{chat}:dedupe",
		k.DedupeTokens: "p:q:{chat}:dedupe-tokens",
	} {
		if got != want {
			t.Errorf("key %q, want %q", got, want)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	t.Cleanup(func() { _ = rdb.Close() })
	for _, tc := range []struct {
		name string
		cfg  *PublisherConfig
		ok   bool
	}{
		{"nil", nil, false},
		{"no queue", &PublisherConfig{}, false},
		{"defaults", &PublisherConfig{Queue: "q"}, true},
		{"brace", &PublisherConfig{Queue: "a}b"}, false},
		{"negative ttl", &PublisherConfig{Queue: "q", DedupeTTL: -time.Second}, false},
		{"sub-ms ttl", &PublisherConfig{Queue: "q", DedupeTTL: time.Microsecond}, false},
	} {
		_, err := NewPublisher(rdb, tc.cfg)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalidConfig)) {
			t.Errorf("publisher %s: err %v", tc.name, err)
		}
	}
	if _, err := NewPublisher(nil, &PublisherConfig{Queue: "q"}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("nil client: %v", err)
	}
	base := ConsumerConfig{Queue: "q", Group: "g", Consumer: "c"}
	for _, tc := range []struct {
		name string
		edit func(*ConsumerConfig)
		ok   bool
	}{
		{"defaults", func(*ConsumerConfig) {}, true},
		{"no queue", func(c *ConsumerConfig) { c.Queue = "" }, false},
		{"no group", func(c *ConsumerConfig) { c.Group = "" }, false},
		{"brace", func(c *ConsumerConfig) { c.Queue = "{q" }, false},
		{"no consumer", func(c *ConsumerConfig) { c.Consumer = "" }, false},
		{"negative block", func(c *ConsumerConfig) { c.Block = -1 }, false},
		{"sub-ms lock", func(c *ConsumerConfig) { c.LockDuration = time.Microsecond }, false},
		{"negative trim", func(c *ConsumerConfig) { c.TrimInterval = -time.Second }, false},
		{"short lock", func(c *ConsumerConfig) { c.LockDuration = 2 * time.Millisecond }, true},
	} {
		cfg := base
		tc.edit(&cfg)
		c, err := NewConsumer(rdb, &cfg)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalidConfig)) {
			t.Errorf("consumer %s: err %v", tc.name, err)
		}
		if tc.name == "defaults" && (c.block != DefaultBlock || c.lock != DefaultLockDuration ||
			c.claimI != DefaultLockDuration/2 || c.trimI != DefaultTrimInterval) {
			t.Errorf("defaults not applied: %+v", c)
		}
	}
}

func TestDurabilityErrorMessage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		e    DurabilityError
		want []string
	}{
		{DurabilityError{"no", "noeviction"}, []string{`appendonly is "no"`}},
		{DurabilityError{"yes", "allkeys-lru"}, []string{`maxmemory-policy is "allkeys-lru"`}},
		{DurabilityError{"no", "volatile-lru"}, []string{`appendonly is "no"`, `"volatile-lru"`}},
	} {
		msg := tc.e.Error()
		for _, w := range tc.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%q lacks %q", msg, w)
			}
		}
	}
}

func TestParseSentinelURL(t *testing.T) {
	for _, tc := range []struct {
		url     string
		addrs   string
		master  string
		db      int
		user    string
		wantErr bool
	}{
		{"redis+sentinel://h1:26379,h2:26380/mymaster/0", "[h1:26379 h2:26380]", "mymaster", 0, "", false},
		{"redis+sentinel://u:p@127.0.0.1:5000/m/3", "[127.0.0.1:5000]", "m", 3, "u", false},
		{"redis+sentinel://h1/m", "[h1:26379]", "m", 0, "", false},
		{"redis+sentinel://h1:1/", "", "", 0, "", true},
		{"redis+sentinel:///m", "", "", 0, "", true},
		{"redis+sentinel://h1:1/m/x", "", "", 0, "", true},
		{"redis://h1:1/0", "", "", 0, "", true},
	} {
		fo, err := ParseSentinelURL(tc.url)
		if tc.wantErr {
			if err == nil {
				t.Errorf("%s: no error", tc.url)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.url, err)
			continue
		}
		if fmt.Sprint(fo.SentinelAddrs) != tc.addrs || fo.MasterName != tc.master || fo.DB != tc.db || fo.Username != tc.user {
			t.Errorf("%s: got %v %q db %d user %q", tc.url, fo.SentinelAddrs, fo.MasterName, fo.DB, fo.Username)
		}
	}
	if _, err := NewClient("redis+sentinel://h1:1/"); err == nil {
		t.Error("NewClient accepted a sentinel url without a master name")
	}
}

func TestDecodeHeadersEntry(t *testing.T) {
	t.Parallel()
	d := decodeEntry("1-0", map[string]any{"id": "a", "name": "n", "payload": "p", "headers": `{"k":"v"}`})
	if d.Err != nil || d.Headers["k"] != "v" {
		t.Fatalf("decode %+v", d)
	}
	for _, bad := range []any{`{"k":1}`, 7, `{"a b":"v"}`} {
		if d := decodeEntry("1-0", map[string]any{"id": "a", "name": "n", "payload": "p", "headers": bad}); !errors.Is(d.Err, ErrMalformedEntry) || d.ID != "a" {
			t.Errorf("headers %v: %+v, want ErrMalformedEntry with the id kept", bad, d)
		}
	}
}
