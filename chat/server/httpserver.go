package server

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxchat/outboxchat/chat/httpapi"
	"github.com/outboxchat/outboxchat/internal/service"
)

// httpService serves the API on a listener that is already bound, as one
// of Serve's services (internal/service contract): Start serves in a
// goroutine of the run; Stop first sets stopping (/readyz then answers 503
// "stopping") and keeps serving for delay (Config.ShutdownDelay, cut short
// when Stop's ctx ends), then stops taking connections, waits for
// in-flight requests (net/http Shutdown), closes the WebSockets (hijacked,
// so Shutdown does not wait for them) and waits for their handlers, then
// closes the server — all bounded by Stop's ctx. Serve starts it last, so
// it stops first.
type httpService struct {
	srv  *http.Server
	ln   net.Listener
	api  *httpapi.API
	log  *slog.Logger
	tls  bool // ln is a TLS listener
	life service.Lifecycle
	once sync.Once // closeSockets runs once
	// stopping is set first thing in Stop (read by /readyz); delay is how
	// long the API then keeps serving. nil and 0: none.
	stopping *atomic.Bool
	delay    time.Duration
}

func (h *httpService) Start(ctx context.Context) error {
	return h.life.Start(ctx, func(r *service.Run) {
		r.Go(func() {
			if err := h.srv.Serve(h.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				h.log.Error("http", "err", err)
			}
		})
		// A hard stop (Start's ctx ended) closes the server at once.
		r.Go(func() {
			select {
			case <-r.Context().Done():
				_ = h.srv.Close()
			case <-r.Stopping():
			}
		})
	})
}

func (h *httpService) Stop(ctx context.Context) error {
	h.once.Do(func() {
		if h.stopping != nil {
			h.stopping.Store(true)
		}
		if h.delay > 0 {
			h.log.Info("not ready, serving on", "shutdown_delay", h.delay)
			t := time.NewTimer(h.delay)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		}
		_ = h.srv.Shutdown(ctx)
		if err := h.api.CloseSockets(ctx); err != nil {
			h.log.Warn("stopping", "err", err)
		}
		_ = h.srv.Close()
	})
	return h.life.Stop(ctx)
}

// announce logs that the API listens, and calls c.API.Listening.
func (h *httpService) announce(c *Config) {
	addr := h.ln.Addr().String()
	h.log.Info("listening", "addr", addr, "mode", c.Mode, "wake", c.API.Wake.String(), "tls", h.tls)
	if c.API.Listening != nil {
		c.API.Listening(addr)
	}
}
