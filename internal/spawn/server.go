package spawn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// Server is the lifecycle that the private servers (pgproc, redisproc,
// pgbouncerproc) share: the one process a server runs at a time, the lock
// that serialises starting, stopping and killing it, and a Close that runs
// once. Set the fields before the first call; the methods are then safe for
// concurrent use.
type Server struct {
	// Name prefixes the errors and log messages ("pgproc").
	Name string
	// Log receives "<name>: stopped", "killed" and "restarted". Required.
	Log *slog.Logger
	// Port is the server's port, for the log messages: set it before Start.
	Port int
	// Launch starts the process and waits until it serves, with the lock
	// held. On error, a non-nil *Proc is a process it started, which Start
	// then kills.
	Launch func(ctx context.Context) (*Proc, error)
	// KillProc SIGKILLs a process and waits until it is gone. nil:
	// (*Proc).Kill, for a server whose process group holds all its
	// processes.
	KillProc func(p *Proc) error
	// StopSignal is the graceful shutdown signal of Restart and Close.
	StopSignal syscall.Signal
	// Dir, when not "", is the directory the server created, which Close
	// removes.
	Dir string

	mu     sync.Mutex
	run    *Proc // nil when not running
	closed bool
}

// Start launches the process (Launch). On error nothing is left running.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.startLocked(ctx)
}

func (s *Server) startLocked(ctx context.Context) error {
	p, err := s.Launch(ctx)
	if p != nil {
		s.run = p
	}
	if err != nil {
		_ = s.killLocked()
		return err
	}
	return nil
}

// Running reports whether the server's process is alive.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.run.Alive()
}

// PID is the running process's pid, 0 when none runs.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.run.Alive() || s.run.Cmd.Process == nil {
		return 0
	}
	return s.run.Cmd.Process.Pid
}

// Stop sends sig to the process and waits until it and its process group
// are gone. If ctx ends first the process is killed and the error wraps
// ctx's. Stopping a stopped server is a no-op.
func (s *Server) Stop(ctx context.Context, sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopLocked(ctx, sig)
}

func (s *Server) stopLocked(ctx context.Context, sig syscall.Signal) error {
	if s.run == nil {
		return nil
	}
	if err := s.run.Stop(ctx, sig); err != nil {
		_ = s.killLocked()
		return fmt.Errorf("%s: stop: %w (killed)", s.Name, err)
	}
	s.run = nil
	s.Log.Info(s.Name+": stopped", "port", s.Port)
	return nil
}

// Kill SIGKILLs the process (KillProc) and waits until it is gone: a
// crash. Killing a stopped server is a no-op. The error is KillProc's.
func (s *Server) Kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.killLocked()
}

func (s *Server) killLocked() error {
	r := s.run
	if r == nil {
		return nil
	}
	kill := s.KillProc
	if kill == nil {
		kill = (*Proc).Kill
	}
	err := kill(r)
	s.run = nil
	if err != nil {
		return fmt.Errorf("%s: %w", s.Name, err)
	}
	s.Log.Info(s.Name+": killed", "port", s.Port)
	return nil
}

// Signal sends sig to the process's group (SIGSTOP, SIGCONT). It returns
// an error when the server is not running.
func (s *Server) Signal(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.run == nil {
		return fmt.Errorf("%s: %v: server not running", s.Name, sig)
	}
	if err := syscall.Kill(-s.run.Cmd.Process.Pid, sig); err != nil {
		return fmt.Errorf("%s: %v: %w", s.Name, sig, err)
	}
	return nil
}

// Restart stops a running server (StopSignal) and launches it again. It
// fails after Close.
func (s *Server) Restart(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("%s: restart of closed server", s.Name)
	}
	if err := s.stopLocked(ctx, s.StopSignal); err != nil {
		return err
	}
	if err := s.startLocked(ctx); err != nil {
		return err
	}
	s.Log.Info(s.Name+": restarted", "port", s.Port)
	return nil
}

// Close, once (later calls return nil), stops the server (StopSignal)
// within timeout, kills whatever is left, then removes Dir unless it is "".
// The error is the stop's, else the removal's.
func (s *Server) Close(timeout time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := s.stopLocked(ctx, s.StopSignal)
	if s.run != nil { // the stop's kill failed; try once more
		_ = s.killLocked()
	}
	if s.Dir != "" {
		if rerr := os.RemoveAll(s.Dir); rerr != nil && err == nil {
			err = fmt.Errorf("%s: remove dir: %w", s.Name, rerr)
		}
	}
	return err
}

// ErrBind marks a start that failed because the port was taken (by another
// process, between FreePort and the server's bind); OnFreePort retries it.
var ErrBind = errors.New("could not bind port")

// OnFreePort calls start with port fixed or, when fixed is 0, with a port
// FreePort picked; while start fails with ErrBind on a picked port and ctx
// has not ended it tries another, five tries in all. It returns the port
// start succeeded on, or start's last error. name prefixes FreePort's
// errors and the warning logged before a retry.
func OnFreePort(ctx context.Context, fixed int, name string, log *slog.Logger, start func(port int) error) (int, error) {
	for attempt := 0; ; attempt++ {
		port := fixed
		if port == 0 {
			var err error
			if port, err = FreePort(); err != nil {
				return 0, fmt.Errorf("%s: %w", name, err)
			}
		}
		err := start(port)
		if err == nil {
			return port, nil
		}
		if fixed != 0 || attempt >= 4 || !errors.Is(err, ErrBind) || ctx.Err() != nil {
			return 0, err
		}
		log.Warn(name+": port taken, retrying", "port", port)
	}
}

// Dir returns the directory a private server named name keeps its files
// in: dir made absolute and created when dir is not "", else a new temp
// dir (TempDir) after the stale ones of dead processes are removed
// (ReapStale). own is the temp dir, which the server removes on Close
// (Server.Dir), and "" for the caller's dir. Errors are prefixed with name.
func Dir(name, dir string, log *slog.Logger) (path, own string, err error) {
	if dir != "" {
		if path, err = filepath.Abs(dir); err != nil {
			return "", "", fmt.Errorf("%s: %w", name, err)
		}
		if err := os.MkdirAll(path, 0o755); err != nil {
			return "", "", fmt.Errorf("%s: create dir: %w", name, err)
		}
		return path, "", nil
	}
	ReapStale(name+"-", log)
	if path, err = TempDir(name + "-"); err != nil {
		return "", "", fmt.Errorf("%s: %w", name, err)
	}
	return path, path, nil
}

// TempDir creates a new temp dir named prefix* holding this process's
// owner file (WriteOwner), so that ReapStale removes it once the process is
// gone.
func TempDir(prefix string) (string, error) {
	d, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", fmt.Errorf("create temp dir: %w", err)
	}
	if err := WriteOwner(d); err != nil {
		_ = os.RemoveAll(d)
		return "", err
	}
	return d, nil
}

// Binary returns the path of the executable name on PATH, else fallback.
// The error says neither is an executable file; fallback is returned with
// it.
func Binary(name, fallback string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	if fi, err := os.Stat(fallback); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		return fallback, fmt.Errorf("%s not found on PATH or at %s", name, fallback)
	}
	return fallback, nil
}
