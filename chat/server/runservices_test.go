package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/internal/service"
	"github.com/outboxchat/outboxchat/internal/testenv"
)

// fakeService records its Start and Stop calls in a shared journal.
type fakeService struct {
	name     string
	failWith error
	journal  *journal
}

type journal struct {
	mu  sync.Mutex
	log []string
}

func (j *journal) add(s string) { j.mu.Lock(); j.log = append(j.log, s); j.mu.Unlock() }

func (j *journal) get() []string { j.mu.Lock(); defer j.mu.Unlock(); return slices.Clone(j.log) }

func (f *fakeService) Start(context.Context) error {
	if f.failWith != nil {
		f.journal.add("fail " + f.name)
		return f.failWith
	}
	f.journal.add("start " + f.name)
	return nil
}

func (f *fakeService) Stop(context.Context) error { f.journal.add("stop " + f.name); return nil }

// runServices starts the list in order, calls up once all have started,
// and on ctx's end stops them in reverse; a failed Start stops the ones
// before it (and not the rest) and is returned.
func TestRunServices(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	j := &journal{}
	svcs := []service.Service{&fakeService{name: "a", journal: j}, &fakeService{name: "b", journal: j}, &fakeService{name: "c", journal: j}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runServices(ctx, quiet, svcs, func() { j.add("up") }) }()
	testenv.WaitFor(t, 10*time.Second, "every service started", func() bool { return slices.Contains(j.get(), "up") })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if want := []string{"start a", "start b", "start c", "up", "stop c", "stop b", "stop a"}; !slices.Equal(j.get(), want) {
		t.Fatalf("journal %v, want %v", j.get(), want)
	}

	j = &journal{}
	boom := errors.New("boom")
	svcs = []service.Service{&fakeService{name: "a", journal: j}, &fakeService{name: "b", failWith: boom, journal: j}, &fakeService{name: "c", journal: j}}
	if err := runServices(context.Background(), quiet, svcs, func() { j.add("up") }); !errors.Is(err, boom) {
		t.Fatalf("err = %v, want boom", err)
	}
	if want := []string{"start a", "fail b", "stop a"}; !slices.Equal(j.get(), want) {
		t.Fatalf("journal %v, want %v", j.get(), want)
	}
}
