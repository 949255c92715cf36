package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/lab/probe"
)

// TestUpInstances: `lab up --instances 2` runs two API+worker processes per
// service, each printed as its own consumers: / workers: line, and they
// are one service: a message sent to either instance of one side reaches
// a WebSocket client of either instance of the other, each once; a
// client of one instance sees what was sent through the other instance of
// its own service.
func TestUpInstances(t *testing.T) {
	t.Parallel()
	u := startUp(t, "token", "--instances", "2")
	cons, work, token := u.all["consumers"], u.all["workers"], u.lines["token"]
	if len(cons) != 2 || len(work) != 2 || cons[0] == cons[1] || work[0] == work[1] {
		t.Fatalf("lab up --instances 2 printed consumers %v, workers %v: want two distinct URLs each", cons, work)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const chatID = 7
	var watchers []*probe.Watcher
	for _, base := range []string{cons[0], cons[1], work[0], work[1]} {
		w := connectWatcher(ctx, t, base, chatID, token)
		watchers = append(watchers, w)
	}
	snd := probe.NewSender(token)
	var sent []chat.Message
	for i, base := range []string{cons[1], cons[0], work[0], work[1]} {
		m, err := snd.Send(ctx, base, chatID, fmt.Sprint("through instance ", i))
		if err != nil {
			t.Fatal(err)
		}
		sent = append(sent, m)
	}
	for k, w := range watchers {
		for ctx.Err() == nil {
			done := true
			for _, m := range sent {
				done = done && w.SeenID(m.ID)
			}
			if done {
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("client %d (of %v) did not see all 4 messages: frames %v", k, append(cons, work...), w.Frames())
		}
		per := map[string]int{}
		for _, f := range w.Frames() {
			per[f.Message.ID]++
		}
		for _, m := range sent {
			if per[m.ID] != 1 {
				t.Errorf("message %s shown %d times on one client, want once", m.ID, per[m.ID])
			}
		}
	}
}

// TestUpPartitions: `lab up --partitions 4` runs both services with four
// lanes each way (the services' Redis users limited to the partitions'
// keys): messages to a chat of every partition, both ways, reach a client
// of the other side once each.
func TestUpPartitions(t *testing.T) {
	t.Parallel()
	u := startUp(t, "token", "--partitions", "4")
	cons, work, token := u.all["consumers"], u.all["workers"], u.lines["token"]
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	snd := probe.NewSender(token)
	for chatID := int64(20); chatID < 24; chatID++ {
		for _, dir := range [][2]string{{cons[0], work[0]}, {work[0], cons[0]}} {
			w := connectWatcher(ctx, t, dir[1], chatID, token)
			m, err := snd.Send(ctx, dir[0], chatID, fmt.Sprint("to chat ", chatID))
			if err != nil {
				t.Fatal(err)
			}
			for ctx.Err() == nil && !w.SeenID(m.ID) {
				select {
				case <-ctx.Done():
				case <-time.After(10 * time.Millisecond):
				}
			}
			if ctx.Err() != nil {
				t.Fatalf("chat %d: message from %s not shown on %s: frames %v", chatID, dir[0], dir[1], w.Frames())
			}
			n := 0
			for _, f := range w.Frames() {
				if f.Message.ID == m.ID {
					n++
				}
			}
			if n != 1 {
				t.Fatalf("chat %d: message shown %d times, want once", chatID, n)
			}
		}
	}
}

// connectWatcher starts a WebSocket client of base's chat with token and
// waits until it is connected; it is stopped at the test's end.
func connectWatcher(ctx context.Context, t *testing.T, base string, chatID int64, token string) *probe.Watcher {
	t.Helper()
	w, err := probe.NewWatcher(base, chatID, &probe.WatcherConfig{Token: token})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	if err := probe.Connect(ctx, w); err != nil {
		t.Fatal(err)
	}
	return w
}
