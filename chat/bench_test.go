package chat

import (
	"context"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/outbox"
)

// BenchmarkSend measures Store.Send (chat counter, message, outbox row,
// commit) per op, on the private Postgres, for each wake-up mode, with the
// group committer started ("batched") and without it ("alone": one
// transaction per send, in the caller's goroutine). Parallel: 8 senders per
// core spread over 100 chats; msgs/tx is the mean batch size.
func BenchmarkSend(b *testing.B) {
	for _, mode := range []outbox.WakeMode{outbox.WakeAfterCommit, outbox.WakeInTx} {
		for _, batched := range []bool{true, false} {
			name := mode.String() + "/alone"
			if batched {
				name = mode.String() + "/batched"
			}
			b.Run(name, func(b *testing.B) { benchmarkSend(b, mode, batched) })
		}
	}
}

func benchmarkSend(b *testing.B, mode outbox.WakeMode, batched bool) {
	h := newHarness(b, "")
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, h.roleURL(Consumers))
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	w, err := outbox.NewWriter(pool, &outbox.WriterConfig{Table: "consumers.outbox", Mode: mode})
	if err != nil {
		b.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer w.Stop(ctx)
	s, err := NewStore(pool, Consumers, w)
	if err != nil {
		b.Fatal(err)
	}
	if batched {
		if err := s.Start(ctx); err != nil {
			b.Fatal(err)
		}
		defer s.Stop(ctx)
	}
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var i int64
		for pb.Next() {
			i++
			if _, err := s.Send(ctx, 1+i%100, "benchmark message"); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	var msgs, txs float64
	if err := h.admin.QueryRow(ctx, `SELECT count(*), count(DISTINCT xmin::text) FROM consumers.messages`).Scan(&msgs, &txs); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(msgs/txs, "msgs/tx")
}

// BenchmarkSendWhileChatLocked measures what issue 10 asks of a locked
// chat: HTTP sends to other chats at 100 msg/s (chats 72…171 in turn, one
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
	cons := h.start(Consumers, nil)
	ctx := context.Background()
	for c := int64(72); c < 172; c++ { // warm: one send per chat
		send(b, cons.base, c, "warm")
	}
	var ended sync.WaitGroup
	stop := make(chan struct{})
	var answered201, answered503 atomic.Int64
	if locked {
		defer h.holdChatLock(b, Consumers, 71).Rollback(ctx)
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
					switch code, _, _ := postKeyed(b, authClient, cons.base, 71, "", `{"body":"to the locked chat"}`); code {
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
		code, raw, err := postKeyed(b, authClient, cons.base, 72+int64(i%100), "", `{"body":"elsewhere"}`)
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
