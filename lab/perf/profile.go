package perf

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/outboxchat/outboxchat/lab/env"
)

// Profile window defaults of BenchOptions.ProfileDir.
const (
	// DefaultProfileDelay is how long after the first send the profiles
	// start, so that start-up (connections, plan caches) is left out.
	DefaultProfileDelay = 2 * time.Second
	// DefaultProfileSeconds is the length of the CPU profile window.
	DefaultProfileSeconds = 10
)

// profileWindow takes, from every service process of e (env.Options.Debug),
// an allocation profile, then a CPU profile of seconds s, then a second
// allocation profile, into dir as <process>.cpu.pprof, <process>.allocs0.pprof
// and <process>.allocs1.pprof (go tool pprof -sample_index=alloc_objects
// -base allocs0 allocs1 gives the window's allocations). shown reads the
// number of messages shown so far; dir/window.txt gets the number shown
// during the window, to divide by, and <process>.metrics.txt each API
// process's /metrics at the window's end. It returns when every profile is
// written or ctx ends; errors are joined.
func profileWindow(ctx context.Context, e *env.Env, dir string, s int, shown func() int64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("lab: bench: profiles: %w", err)
	}
	get := func(addr, path, file string, timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", path, resp.Status)
		}
		f, err := os.Create(filepath.Join(dir, file))
		if err != nil {
			return err
		}
		_, err = io.Copy(f, resp.Body)
		return errors.Join(err, f.Close())
	}
	each := func(f func(name, addr string) error) error {
		var wg sync.WaitGroup
		var mu sync.Mutex
		var errs []error
		for name, addr := range e.DebugAddrs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := f(name, addr); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("%s: %w", name, err))
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	allocs := func(n int) error {
		return each(func(name, addr string) error {
			return get(addr, "/debug/pprof/allocs", name+".allocs"+strconv.Itoa(n)+".pprof", 10*time.Second)
		})
	}
	if err := allocs(0); err != nil {
		return fmt.Errorf("lab: bench: profiles: %w", err)
	}
	n0, t0 := shown(), time.Now()
	err := each(func(name, addr string) error {
		return get(addr, "/debug/pprof/profile?seconds="+strconv.Itoa(s), name+".cpu.pprof", time.Duration(s+30)*time.Second)
	})
	n1, t1 := shown(), time.Now()
	err = errors.Join(err, allocs(1))
	for _, p := range e.Procs() {
		if u := p.URL(); u != "" {
			err = errors.Join(err, get(strings.TrimPrefix(u, "http://"), "/metrics", p.Name()+".metrics.txt", 10*time.Second))
		}
	}
	note := fmt.Sprintf("messages shown during the window: %d\nwindow: %.1f s\n", n1-n0, t1.Sub(t0).Seconds())
	err = errors.Join(err, os.WriteFile(filepath.Join(dir, "window.txt"), []byte(note), 0o644))
	if err != nil {
		return fmt.Errorf("lab: bench: profiles: %w", err)
	}
	return nil
}
