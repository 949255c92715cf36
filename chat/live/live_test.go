package live

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/redisq"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// startHub starts a hub of service on the test Redis under prefix; it is
// stopped at cleanup unless the returned cancel (a hard stop: no goodbye,
// as when the process dies) was called.
func startHub(t *testing.T, service, prefix string) (*Hub, context.CancelFunc) {
	t.Helper()
	return startHubOn(t, testenv.Redis(t), service, prefix)
}

// startHubOn is startHub on rdb.
func startHubOn(t *testing.T, rdb redis.UniversalClient, service, prefix string) (*Hub, context.CancelFunc) {
	t.Helper()
	h, err := New(rdb, &Config{Service: service, Prefix: prefix, Heartbeat: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := h.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Stop(context.Background()); cancel() })
	return h, cancel
}

// onlineOf waits until m gets a presence frame listing exactly want.
func onlineOf(t *testing.T, m *Member, d time.Duration, want string) {
	t.Helper()
	end := time.After(d)
	var last string
	for {
		select {
		case b := <-m.C:
			var f struct {
				Type   string
				Online []Person
			}
			if json.Unmarshal(b, &f) != nil || f.Type != "presence" {
				continue
			}
			var got []string
			for _, p := range f.Online {
				got = append(got, p.From+":"+p.Author)
			}
			if last = strings.Join(got, ","); last == want {
				return
			}
		case <-end:
			t.Fatalf("no presence %q within %v (last %q)", want, d, last)
		}
	}
}

// A process that dies (its hub stops without a word) takes its users out
// of the others' presence within the TTL; until then its heartbeat keeps
// them there.
func TestPresenceOfADeadProcessExpires(t *testing.T) {
	prefix := fmt.Sprintf("livetest:%d:", time.Now().UnixNano())
	a, _ := startHub(t, chat.Consumers, prefix)
	b, kill := startHub(t, chat.Workers, prefix)
	ma := a.Join(1, "alice")
	defer ma.Leave()
	mb := b.Join(1, "bob")
	onlineOf(t, ma, 3*time.Second, "consumers:alice,workers:bob")
	// Heartbeats keep bob: no change for several TTLs' worth of beats?
	// (Checked by the absence of a frame dropping him for 2 heartbeats.)
	select {
	case f := <-ma.C:
		if strings.Contains(string(f), "presence") && !strings.Contains(string(f), "bob") {
			t.Fatalf("bob dropped while alive: %s", f)
		}
	case <-time.After(250 * time.Millisecond):
	}
	kill()
	<-b.life.Stopped()
	start := time.Now()
	onlineOf(t, ma, 3*time.Second, "consumers:alice")
	if d := time.Since(start); d > a.TTL()+time.Second {
		t.Fatalf("bob gone after %v, TTL %v", d, a.TTL())
	}
	mb.Leave()
}

// Typing: to every other member of the chat, never back to its sender,
// never to other chats; over the rate, dropped.
func TestTypingReachesOthersRateLimited(t *testing.T) {
	prefix := fmt.Sprintf("livetest:%d:", time.Now().UnixNano())
	a, _ := startHub(t, chat.Consumers, prefix)
	b, _ := startHub(t, chat.Workers, prefix)
	m1, m2 := a.Join(5, "u1"), a.Join(5, "u2")
	m3, other := b.Join(5, "u3"), b.Join(6, "u4")
	defer func() { m1.Leave(); m2.Leave(); m3.Leave(); other.Leave() }()
	onlineOf(t, m3, 3*time.Second, "consumers:u1,consumers:u2,workers:u3")
	for range 10 {
		m1.Typing()
	}
	count := func(m *Member, d time.Duration) int {
		n := 0
		end := time.After(d)
		for {
			select {
			case f := <-m.C:
				if strings.Contains(string(f), `"type":"typing"`) {
					n++
				}
			case <-end:
				return n
			}
		}
	}
	if n := count(m2, 500*time.Millisecond); n != DefaultTypingBurst {
		t.Errorf("same process: %d typing frames, want the burst %d", n, DefaultTypingBurst)
	}
	if n := count(m3, 200*time.Millisecond); n != DefaultTypingBurst {
		t.Errorf("other process: %d typing frames, want %d", n, DefaultTypingBurst)
	}
	if n := count(m1, 100*time.Millisecond) + count(other, 100*time.Millisecond); n != 0 {
		t.Errorf("sender or another chat got %d typing frames", n)
	}
}

// On a Redis Cluster (a redis+cluster:// client per process, each given a
// different node first) presence and typing reach the other process.
func TestLiveOnRedisCluster(t *testing.T) {
	t.Parallel()
	cl := testenv.RedisCluster(t, 3)
	prefix := fmt.Sprintf("livetest:%d:", time.Now().UnixNano())
	var hubs []*Hub
	for i, svc := range []string{chat.Consumers, chat.Workers} {
		rdb, err := redisq.NewClient("redis+cluster://" + cl.Addrs()[i] + "/")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = rdb.Close() })
		h, _ := startHubOn(t, rdb, svc, prefix)
		hubs = append(hubs, h)
	}
	m1, m3 := hubs[0].Join(5, "u1"), hubs[1].Join(5, "u3")
	defer func() { m1.Leave(); m3.Leave() }()
	onlineOf(t, m3, 5*time.Second, "consumers:u1,workers:u3")
	onlineOf(t, m1, 5*time.Second, "consumers:u1,workers:u3")
	m1.Typing()
	end := time.After(5 * time.Second)
	for {
		select {
		case f := <-m3.C:
			if strings.Contains(string(f), `"type":"typing"`) {
				return
			}
		case <-end:
			t.Fatal("no typing frame from the other process")
		}
	}
}
