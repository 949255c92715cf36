package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/cmd/outboxchat/internal/labcmd"
)

// lab up on fixed ports: the URLs it prints are those ports, the services
// answer there, and --keep-logs leaves the logs behind but not the lab's
// secrets.
func TestUpFixedAddrsKeepLogs(t *testing.T) {
	t.Parallel()
	ports := [2]int{fixedPort(t), fixedPort(t)}
	for ports[1] == ports[0] {
		ports[1] = fixedPort(t)
	}
	cons, work := "127.0.0.1:"+strconv.Itoa(ports[0]), "127.0.0.1:"+strconv.Itoa(ports[1])
	u := startUp(t, "redis", "--consumers-addr", strconv.Itoa(ports[0]), "--workers-addr", ":"+strconv.Itoa(ports[1]), "--keep-logs")
	lines := u.lines
	if lines["consumers"] != "http://"+cons || lines["workers"] != "http://"+work {
		t.Fatalf("lab up printed %v (err %v), want consumers on %s and workers on %s", lines, u.stop(), cons, work)
	}
	for _, base := range []string{lines["consumers"], lines["workers"]} {
		resp, err := http.Get(base + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s/healthz: %d", base, resp.StatusCode)
		}
	}
	if err := u.stop(); err != nil {
		t.Fatal(err)
	}
	var dir string
	for _, l := range strings.Split(u.stderr.String(), "\n") {
		if d, ok := strings.CutPrefix(l, "lab: logs kept in "); ok {
			dir = d
		}
	}
	if dir == "" {
		t.Fatalf("no \"lab: logs kept in\" line in:\n%s", u.stderr.String())
	}
	defer os.RemoveAll(dir)
	if fi, err := os.Stat(filepath.Join(dir, "consumers.log")); err != nil || fi.Size() == 0 {
		t.Fatalf("consumers.log after the lab stopped: %v", err)
	}
	for _, f := range []string{"jwt.secret", "event.keys"} {
		if _, err := os.Stat(filepath.Join(dir, f)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s in the kept dir after the lab stopped: %v, want it removed", f, err)
		}
	}
}

// fixedPort picks a port that is free now from below the kernel's
// ephemeral range (32768–60999 on Linux), so that neither an outgoing
// connection nor a server that asked for port 0 takes it before lab up
// binds it: the race that spawn.FreePort warns of.
func fixedPort(t *testing.T) int {
	t.Helper()
	for range 100 {
		p := 20000 + rand.IntN(12000)
		if ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p)); err == nil {
			ln.Close()
			return p
		}
	}
	t.Fatal("no free port in 20000–31999")
	return 0
}

// upRun is a `lab up` running for a test (startUp).
type upRun struct {
	// lines are the "key: value" lines lab up printed, up to the one
	// startUp waited for (the last value of a repeated key); all are
	// every value of each key, in order.
	lines  map[string]string
	all    map[string][]string
	cancel context.CancelFunc
	done   chan error
	stderr strings.Builder // written by lab up until stop returns
	once   sync.Once
	err    error
}

// startUp runs `lab up args` and reads what it prints until the line with
// key last (or 90 s pass). The test's cleanup stops it (stop).
func startUp(t *testing.T, last string, args ...string) *upRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	u := &upRun{lines: map[string]string{}, all: map[string][]string{}, cancel: cancel, done: make(chan error, 1)}
	pr, pw := io.Pipe()
	go func() {
		err := labcmd.Up(ctx, args, pw, &u.stderr)
		pw.Close()
		u.done <- err
	}()
	timer := time.AfterFunc(90*time.Second, func() { pr.CloseWithError(io.ErrUnexpectedEOF) })
	defer timer.Stop()
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ": ")
		u.lines[k] = v
		u.all[k] = append(u.all[k], v)
		if k == last {
			break
		}
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	t.Cleanup(func() {
		if err := u.stop(); err != nil {
			t.Errorf("lab up: %v", err)
		}
	})
	return u
}

// stop ends lab up and returns its error; it waits up to 60 s.
// Idempotent; stderr may be read once it returned.
func (u *upRun) stop() error {
	u.once.Do(func() {
		u.cancel()
		select {
		case u.err = <-u.done:
		case <-time.After(60 * time.Second):
			u.err = errors.New("did not stop within 60 s of its context ending")
		}
	})
	return u.err
}
