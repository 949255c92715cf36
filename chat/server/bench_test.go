package server

import (
	"context"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
)

// BenchmarkSendWhileChatLocked measures what a locked chat costs the
// others: HTTP sends to other chats at 100 msg/s (chats 72…171 in turn, one
// op each, paced every 10 ms) through the whole consumers service (API,
// relay, worker), "free" with no lock held and "locked" while another
// session holds chat 71's lock and chat 71 gets a send every 100 ms while
// fewer than 8 of them wait (each waits the 2 s lock timeout, so about 4/s). It
// reports the other chats' send latency (p50, p99, max, in ms) and, when
// locked, how chat 71's sends ended (locked_503: answered 503 within the
// send lock timeout, default 2 s; locked_201 should stay 0). Run it with
// -benchtime 1000x (10 s per case); the figures are what count, not ns/op.
func BenchmarkSendWhileChatLocked(b *testing.B) {
	for _, locked := range []bool{false, true} {
		name := "free"
		if locked {
			name = "locked"
		}
		b.Run(name, func(b *testing.B) { benchmarkSendWhileChatLocked(b, locked) })
	}
}

func benchmarkSendWhileChatLocked(b *testing.B, locked bool) {
	h := newHarness(b, "")
	cons := h.start(chat.Consumers, nil)
	ctx := context.Background()
	for c := int64(72); c < 172; c++ { // warm: one send per chat
		chattest.Send(b, cons.base, c, "warm")
	}
	var ended sync.WaitGroup
	stop := make(chan struct{})
	var answered201, answered503 atomic.Int64
	if locked {
		defer h.HoldChatLock(b, chat.Consumers, 71).Rollback(ctx)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for range 8 { // up to 8 sends to chat 71 waiting at once
			ended.Add(1)
			go func() {
				defer ended.Done()
				for {
					select {
					case <-stop:
						return
					case <-t.C:
					}
					switch code, _, _ := postKeyed(b, chattest.AuthClient, cons.base, 71, "", `{"body":"to the locked chat"}`); code {
					case http.StatusCreated:
						answered201.Add(1)
					case http.StatusServiceUnavailable:
						answered503.Add(1)
					}
				}
			}()
		}
	}
	lat := make([]time.Duration, 0, b.N)
	pace := time.NewTicker(10 * time.Millisecond)
	defer pace.Stop()
	b.ResetTimer()
	for i := range b.N {
		<-pace.C
		start := time.Now()
		code, raw, err := postKeyed(b, chattest.AuthClient, cons.base, 72+int64(i%100), "", `{"body":"elsewhere"}`)
		if err != nil || code != http.StatusCreated {
			b.Fatalf("send to chat %d: %d %s %v", 72+i%100, code, raw, err)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	close(stop)
	ended.Wait()
	slices.Sort(lat)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(lat[len(lat)/2]), "p50_ms")
	b.ReportMetric(ms(lat[(len(lat)*99)/100]), "p99_ms")
	b.ReportMetric(ms(lat[len(lat)-1]), "max_ms")
	if locked {
		b.ReportMetric(float64(answered503.Load()), "locked_503")
		b.ReportMetric(float64(answered201.Load()), "locked_201")
	}
}
