package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/status"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/natsq"
)

// status and deadletters --broker-url on a private nats-server: status
// reads the queue's figures from JetStream (the dead letters, the
// consumer's unacknowledged events) and its suggested deadletters command
// runs as printed; list (both services, also one whose queue was never
// made), show, replay (the event back on the stream, a repeat a no-op),
// drop --all, and a dead id that is no seq named in the error.
func TestDeadlettersOnNATS(t *testing.T) {
	t.Parallel()
	ns := testenv.PrivateNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, err := natsq.Connect(ns.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// The queue the workers read, as serve makes it, with two events the
	// worker dead-lettered.
	q, err := natsq.New(ctx, nc, natsq.Config{Queue: chat.NATSName(chat.QueueName(chat.Consumers)), Prefix: chat.NATSName(chat.DefaultRedisPrefix)})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Publish(ctx, natsq.Event{ID: "m-1", Name: chat.EventMessageCreated, Payload: []byte(`{"seq":1}`), Sig: "s1"},
		natsq.Event{ID: "m-2", Name: chat.EventMessageCreated, Payload: []byte(`not json`)}); err != nil {
		t.Fatal(err)
	}
	c, err := q.NewConsumer(ctx, natsq.ConsumerConfig{Group: chat.Workers, FetchWait: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ds, err := c.Fetch(ctx, 10)
	if err != nil || len(ds) != 2 {
		t.Fatalf("fetched %+v, %v", ds, err)
	}
	for _, d := range ds {
		if err := c.DeadLetter(ctx, d, "handler: poison"); err != nil {
			t.Fatal(err)
		}
	}
	nf := []string{"--broker-url", ns.URL()}

	dbURL, _ := migratedDatabase(t)
	out, err := runCmd(t, "status", "--json", "--database-url", dbURL, "--broker-url", ns.URL())
	var st status.Status
	if !errors.Is(err, errNeedsPerson) || json.Unmarshal([]byte(out), &st) != nil {
		t.Fatalf("status = %v: %s", err, out)
	}
	if w := st.Services[1]; w.Service != chat.Workers || w.DeadLetters != 2 || w.StreamLength != 2 || w.StreamPending != 0 || w.StreamLag != 0 {
		t.Fatalf("status of the workers %+v; want 2 events, 2 dead letters, nothing pending", w)
	}
	suggested := suggestedCommands(st.Problems)
	if len(suggested) != 1 || !strings.Contains(suggested[0], "--broker-url") {
		t.Fatalf("status suggested %q; want one deadletters list on the broker", suggested)
	}
	args, err := shellSplit(strings.TrimPrefix(suggested[0], "outboxchat "))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := runCmd(t, args...); err != nil || !strings.Contains(out, "m-1") || !strings.Contains(out, "m-2") {
		t.Fatalf("the suggested `%s` = %v:\n%s", suggested[0], err, out)
	}

	out, err = runCmd(t, append([]string{"deadletters", "list", "--json"}, nf...)...)
	var list []deadLetterView
	if err != nil || json.Unmarshal([]byte(out), &list) != nil || len(list) != 2 || list[0].Service != chat.Workers ||
		list[0].ID != "m-1" || list[0].Reason != "handler: poison" || !list[0].Signed || list[1].Signed {
		t.Fatalf("deadletters list = %v: %s", err, out)
	}
	first := list[0].DeadID
	if out, err = runCmd(t, append([]string{"deadletters", "show", "--service", "workers", list[1].DeadID}, nf...)...); err != nil ||
		!strings.Contains(out, "m-2") || !strings.Contains(out, `"not json"`) {
		t.Fatalf("deadletters show = %v: %s", err, out)
	}
	if out, err = runCmd(t, append([]string{"deadletters", "replay", "--service", "workers", first}, nf...)...); err != nil || !strings.Contains(out, "replayed 1 of 1") {
		t.Fatalf("deadletters replay = %v: %s", err, out)
	}
	if out, err = runCmd(t, append([]string{"deadletters", "replay", "--service", "workers", first}, nf...)...); err != nil || !strings.Contains(out, "replayed 0 of 1") {
		t.Fatalf("deadletters replay again = %v: %s", err, out)
	}
	back, err := c.Fetch(ctx, 10)
	if err != nil || len(back) != 1 || back[0].ID != "m-1" || back[0].Sig != "s1" {
		t.Fatalf("after the replay the worker fetched %+v, %v; want m-1 with its signature", back, err)
	}
	if out, err = runCmd(t, append([]string{"deadletters", "drop", "--service", "workers", "--all"}, nf...)...); err != nil || !strings.Contains(out, "dropped 1 of 1") {
		t.Fatalf("deadletters drop --all = %v: %s", err, out)
	}
	if out, err = runCmd(t, append([]string{"deadletters", "list", "--json"}, nf...)...); err != nil || strings.TrimSpace(out) != "[]" {
		t.Fatalf("deadletters list after the drop = %v: %s", err, out)
	}
	if _, err = runCmd(t, append([]string{"deadletters", "drop", "--service", "workers", "1-0"}, nf...)...); err == nil || !strings.Contains(err.Error(), "stream seq") {
		t.Fatalf("a Redis entry id on NATS: %v, want an error naming the stream seq", err)
	}
}
