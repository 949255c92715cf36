package httpapi

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/outboxchat/outboxchat/chat"
)

// benchRoom is a Rooms whose one follower gets the frames sent on c.
type benchRoom struct{ c chan []byte }

func (r benchRoom) Follow(int64, int64, int64) (<-chan []byte, <-chan struct{}, func()) {
	return r.c, make(chan struct{}), func() {}
}

// benchReader is a Reader of an empty chat.
type benchReader struct{}

func (benchReader) History(context.Context, int64, int64, int64, int) (chat.History, error) {
	return chat.History{}, nil
}
func (benchReader) DeliveredUpTo(context.Context, int64) (int64, time.Time, error) {
	return 0, time.Time{}, nil
}

// benchSender refuses every send (the benchmark sends none).
type benchSender struct{}

func (benchSender) SendIdempotent(context.Context, int64, string, string, string) (chat.Message, bool, error) {
	return chat.Message{}, false, io.ErrUnexpectedEOF
}

// BenchmarkWSPush is one live frame (300 bytes) through handleWS: the
// room hands it to the socket's loop, which writes it; the client reads
// it before the next one is handed over, as a chat's frames come at a
// human pace (the loop waits for each). ns/op and allocs/op are per
// frame, the client's reading included.
func BenchmarkWSPush(b *testing.B) {
	room := benchRoom{c: make(chan []byte, 1)}
	c := benchSocket(b, Deps{Sender: benchSender{}, Reader: benchReader{}, Rooms: room},
		&Config{Service: chat.Workers, ListenAddr: "127.0.0.1:0", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	frame := bytes.Repeat([]byte("x"), 300)
	b.ReportAllocs()
	cpu0 := cpuTime(b)
	for b.Loop() {
		room.c <- frame
		if _, got, err := c.Read(context.Background()); err != nil || len(got) != len(frame) {
			b.Fatalf("read %d bytes, %v", len(got), err)
		}
	}
	// The process's CPU time (user and system) per frame: ns/op is mostly
	// the two goroutines' hand-overs and the loopback's latency.
	b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
}

// cpuTime returns the process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchSocket serves an API of deps and cfg on a loopback server and
// returns a client's WebSocket on chat 1 of it; the cleanup closes both.
func benchSocket(b *testing.B, deps Deps, cfg *Config) *websocket.Conn {
	a, err := New(deps, cfg)
	if err != nil {
		b.Fatal(err)
	}
	mux := http.NewServeMux()
	a.Register(mux)
	srv := httptest.NewServer(a.Handler(mux, nil))
	b.Cleanup(srv.Close)
	b.Cleanup(func() { a.CloseSockets(context.Background()) })
	c, _, err := websocket.Dial(context.Background(), "ws"+strings.TrimPrefix(srv.URL, "http")+"/ws?chat_id=1", nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.CloseNow() })
	return c
}
