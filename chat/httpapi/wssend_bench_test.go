package httpapi

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"

	"github.com/coder/websocket"

	"github.com/outboxchat/outboxchat/chat"
)

// BenchmarkWSSend is send frames through handleWS, each answered with its
// ack, with a Sender that stores nothing: the socket side's own CPU per
// send. one keeps one send in flight, as a chat client typing does (and as
// lab bench --transport ws does); window16 keeps 16 in flight on the
// socket, as a client sending a burst does. ns/op and cpu-ns/op are per
// send, the client's writing and reading included.
func BenchmarkWSSend(b *testing.B) {
	for _, window := range []int{1, 16} {
		name := "one"
		if window > 1 {
			name = "window" + strconv.Itoa(window)
		}
		b.Run(name, func(b *testing.B) { benchWSSend(b, window) })
	}
}

func benchWSSend(b *testing.B, window int) {
	deps := benchDeps{}
	c := benchSocket(b, Deps{Sender: deps, Reader: deps, Rooms: deps}, &Config{
		Service: chat.Consumers, ListenAddr: "127.0.0.1:0", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Guard: GuardConfig{UserRate: -1, IPRate: -1},
	})
	ctx := context.Background()
	frames := make([][]byte, window)
	for i := range frames {
		frames[i] = []byte(`{"type":"send","client_id":"c-17-` + strconv.Itoa(1000+i) + `","body":"a message of some forty bytes, <b>bold</b>"}`)
	}
	b.ReportAllocs()
	cpu0 := cpuTime(b)
	n := 0
	for b.Loop() {
		if err := c.Write(ctx, websocket.MessageText, frames[n%window]); err != nil {
			b.Fatal(err)
		}
		n++
		if n%window != 0 {
			continue
		}
		for range window {
			if _, got, err := c.Read(ctx); err != nil || !strings.Contains(string(got), `"type":"ack"`) {
				b.Fatalf("read %s, %v", got, err)
			}
		}
	}
	for range n % window {
		if _, _, err := c.Read(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
}
