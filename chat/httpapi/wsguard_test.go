package httpapi

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// wsPair serves one WebSocket with a frameWriter of the given timeout
// and hands the server's result (the frames written, whether a write
// timed out, the last write error) to done; client is the peer.
func wsPair(t *testing.T, timeout time.Duration, frames int, frame []byte) (client *websocket.Conn, done <-chan fwResult) {
	t.Helper()
	res := make(chan fwResult, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			res <- fwResult{err: err}
			return
		}
		defer c.CloseNow()
		fw := newFrameWriter(c, timeout)
		defer fw.stop()
		var out fwResult
		for out.n < frames {
			if out.err = fw.write(frame); out.err != nil {
				break
			}
			out.n++
		}
		out.timedOut = fw.timedOut()
		res <- out
	}))
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.CloseNow() })
	return c, res
}

type fwResult struct {
	n        int
	timedOut bool
	err      error
}

// A client that reads gets every frame, and writes spread over several
// timeouts do not time out: the timer only runs during a write.
func TestFrameWriterWritesEveryFrame(t *testing.T) {
	t.Parallel()
	frame := []byte(`{"id":"x","body":"hello"}`)
	c, done := wsPair(t, 5*time.Second, 200, frame)
	for i := range 200 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, b, err := c.Read(ctx)
		cancel()
		if err != nil || !bytes.Equal(b, frame) {
			t.Fatalf("frame %d: %q, %v", i, b, err)
		}
	}
	r := <-done
	if r.n != 200 || r.err != nil || r.timedOut {
		t.Fatalf("server: %+v, want 200 frames and no error", r)
	}
}

// A client that never reads fills the socket's buffers; the write that
// blocks then fails after the timeout, and the writer says it timed out.
func TestFrameWriterTimesOutOnAClientThatDoesNotRead(t *testing.T) {
	t.Parallel()
	frame := bytes.Repeat([]byte("x"), 64<<10)
	_, done := wsPair(t, 2*time.Second, 1<<20, frame)
	var r fwResult
	select {
	case r = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("no write timed out within 60 s")
	}
	if r.err == nil || !r.timedOut {
		t.Fatalf("server: %+v, want a failed write that timed out", r)
	}
	if r.n == 0 {
		t.Fatalf("server: no frame written before the timeout: %+v", r)
	}
}

// BenchmarkWSWriteFrame is one live frame (300 bytes) written to a
// WebSocket whose client reads everything: with a context.WithTimeout per
// frame (the code before frameWriter) and with frameWriter. ns/op and
// allocs/op are per frame, the client's reading included.
func BenchmarkWSWriteFrame(b *testing.B) {
	frame := bytes.Repeat([]byte("x"), 300)
	for _, mode := range []string{"WithTimeout", "frameWriter"} {
		b.Run(mode, func(b *testing.B) {
			start := make(chan int)
			done := make(chan error, 1)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				c, err := websocket.Accept(w, r, nil)
				if err != nil {
					done <- err
					return
				}
				defer c.CloseNow()
				ctx := r.Context()
				fw := newFrameWriter(c, wsWriteTimeout)
				defer fw.stop()
				n := <-start
				for range n {
					if mode == "frameWriter" {
						err = fw.write(frame)
					} else {
						wctx, cancel := context.WithTimeout(ctx, wsWriteTimeout)
						err = c.Write(wctx, websocket.MessageText, frame)
						cancel()
					}
					if err != nil {
						break
					}
				}
				done <- err
			}))
			defer srv.Close()
			c, _, err := websocket.Dial(context.Background(), "ws"+strings.TrimPrefix(srv.URL, "http"), nil)
			if err != nil {
				b.Fatal(err)
			}
			defer c.CloseNow()
			b.ReportAllocs()
			b.ResetTimer()
			start <- b.N
			for range b.N {
				if _, _, err := c.Read(context.Background()); err != nil {
					b.Fatal(err)
				}
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		})
	}
}
