package server

import (
	"context"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/internal/testenv"
)

// metricValue returns the value of series (a name with its labels as
// exposed, e.g. `outboxchat_ws_frames_total{direction="in"}`) in a
// /metrics text.
func metricValue(text, series string) (float64, bool) {
	for line := range strings.Lines(text) {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v, err == nil
		}
	}
	return 0, false
}

// scrape returns the value of series on base's /metrics (-1 when absent).
func scrape(t *testing.T, base, series string) float64 {
	t.Helper()
	text, err := chattest.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	v, ok := metricValue(text, series)
	if !ok {
		return -1
	}
	return v
}

// The end-to-end histogram observes, on the receiving service, exactly
// received_at − sent_at of each message its inbox stored (database clock);
// the WebSocket gauge follows connections, and frames are counted in and
// out.
func TestEndToEndAndWebSocketMetrics(t *testing.T) {
	t.Parallel()
	h, cons, work := startBoth(t)
	const chatN = 4
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if v := scrape(t, work.base, "outboxchat_e2e_seconds_count"); v != 0 {
		t.Fatalf("e2e count before any message = %v, want 0", v)
	}

	raw, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(work.base, "http")+"/ws?chat_id=4", chattest.WSOpts(chattest.Token()))
	if err != nil {
		t.Fatal(err)
	}
	rawDone := make(chan struct{})
	go func() {
		defer close(rawDone)
		for {
			if _, _, err := raw.Read(ctx); err != nil {
				return
			}
		}
	}()
	w := chattest.Watch(t, work.base, chatN)
	testenv.WaitFor(t, 30*time.Second, "2 WebSocket connections on workers", func() bool {
		return scrape(t, work.base, "outboxchat_ws_connections") == 2
	})
	for _, b := range []string{"one", "two", "three"} {
		chattest.Send(t, cons.base, chatN, b)
	}
	w.WaitSeqs(t, chat.Consumers, 3, 30*time.Second)
	if err := raw.Write(ctx, websocket.MessageText, []byte(`{"body": "from the socket"}`)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the socket's send counted and received by consumers", func() bool {
		return scrape(t, work.base, `outboxchat_ws_frames_total{direction="in"}`) == 1 &&
			scrape(t, cons.base, "outboxchat_e2e_seconds_count") == 1
	})
	// Out: 3 messages on each of the two sockets, plus the socket's own
	// message and receipts.
	if v := scrape(t, work.base, `outboxchat_ws_frames_total{direction="out"}`); v < 6 {
		t.Errorf("frames out = %v, want at least 6", v)
	}

	// Exactly the rows' received_at − sent_at, on each receiving side.
	for _, side := range []struct {
		base, schema string
		n            float64
	}{{work.base, "workers", 3}, {cons.base, "consumers", 1}} {
		var want float64
		if err := h.Admin.QueryRow(ctx, `SELECT coalesce(sum(extract(epoch FROM received_at - sent_at)), 0)::float8 FROM `+side.schema+`.inbox`).Scan(&want); err != nil {
			t.Fatal(err)
		}
		count := scrape(t, side.base, "outboxchat_e2e_seconds_count")
		sum := scrape(t, side.base, "outboxchat_e2e_seconds_sum")
		if count != side.n || math.Abs(sum-want) > 1e-6 || sum <= 0 {
			t.Errorf("%s: e2e count %v sum %v, want %v and the inbox rows' sum of received_at − sent_at %v", side.schema, count, sum, side.n, want)
		}
	}
	if v := scrape(t, cons.base, "outboxchat_ws_connections"); v != 0 {
		t.Errorf("consumers ws connections = %v, want 0", v)
	}

	raw.Close(websocket.StatusNormalClosure, "")
	<-rawDone
	testenv.WaitFor(t, 30*time.Second, "1 WebSocket connection on workers after a close", func() bool {
		return scrape(t, work.base, "outboxchat_ws_connections") == 1
	})
}
