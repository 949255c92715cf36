// Package spawn starts the child processes of the tests and the lab
// (postgres, redis-server, outboxchat) so that they die with the Go process
// that started them, and holds the small process and port helpers they share.
package spawn

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Pdeathsig design: the Linux parent-death signal is delivered when the
// *thread* that forked the child exits, not when the process exits. The Go
// runtime may retire OS threads (notably when a goroutine that called
// runtime.LockOSThread returns without unlocking), which would SIGKILL our
// servers at a random time. To make Pdeathsig both safe and effective, every
// child is started from one dedicated goroutine that locks its OS thread and
// never returns, so that thread lives exactly as long as the process. If the
// Go process dies (even by SIGKILL), the kernel SIGKILLs the child.

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

var (
	spawnOnce sync.Once
	spawnCh   chan spawnReq
)

// spawnLoop runs forever on a locked OS thread; see the file comment.
func spawnLoop(ch <-chan spawnReq) {
	runtime.LockOSThread()
	for r := range ch {
		r.done <- r.cmd.Start()
	}
}

// Start starts cmd on the spawner thread with Setpgid (its own process
// group: a Ctrl-C on the terminal does not reach it) and Pdeathsig SIGKILL
// (it dies with this process, even when this process is SIGKILLed). Safe
// for concurrent use; it returns cmd.Start's error.
func Start(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true // own process group: terminal Ctrl-C does not reach it
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	spawnOnce.Do(func() {
		spawnCh = make(chan spawnReq)
		go spawnLoop(spawnCh)
	})
	done := make(chan error, 1)
	spawnCh <- spawnReq{cmd: cmd, done: done}
	return <-done
}

// FreePort asks the kernel for a free TCP port on 127.0.0.1. The port is
// released before returning, so a race with other processes is possible;
// callers retry on bind failure.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pick free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// FreeAddr is FreePort as "127.0.0.1:PORT".
func FreeAddr() (string, error) {
	p, err := FreePort()
	if err != nil {
		return "", err
	}
	return "127.0.0.1:" + strconv.Itoa(p), nil
}

// GroupAlive reports whether any non-zombie process is in process group pgid.
// Zombies are ignored because reparented children may never be reaped if
// PID 1 does not reap.
func GroupAlive(pgid int) bool {
	if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return true
	}
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// Format: pid (comm) state ppid pgrp ...; comm may contain spaces.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		if pg, _ := strconv.Atoi(f[2]); pg == pgid {
			return true
		}
	}
	return false
}

// WaitGroupGone polls until process group pgid has no live members or the
// timeout elapses. It reports whether the group is gone.
func WaitGroupGone(pgid int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for GroupAlive(pgid) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// TailFile returns up to n bytes from the end of the file at path, for error
// messages.
func TailFile(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	off := st.Size() - n
	if off < 0 {
		off = 0
	}
	buf := make([]byte, st.Size()-off)
	_, _ = f.ReadAt(buf, off)
	return strings.TrimSpace(string(buf))
}

// OwnerFile is the name of the file, written into every temp dir that
// pgproc and redisproc create, holding the pid of the creating Go process. If that process dies without Close (SIGKILL,
// test timeout), Pdeathsig kills the server but the dir stays behind;
// ReapStale removes such dirs on a later Start.
const OwnerFile = "owner.pid"

// WriteOwner writes this process's pid into dir's owner file, for ReapStale.
func WriteOwner(dir string) error {
	return os.WriteFile(filepath.Join(dir, OwnerFile), []byte(strconv.Itoa(os.Getpid())), 0o644)
}

// ReapStale removes temp dirs named prefix* whose owner process is gone.
// Dirs without an owner file (being created right now, or not ours) are left
// alone. Errors are ignored: this is best-effort housekeeping.
func ReapStale(prefix string, log interface{ Info(string, ...any) }) {
	m, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"*"))
	for _, d := range m {
		b, err := os.ReadFile(filepath.Join(d, OwnerFile))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			continue
		}
		if err := os.RemoveAll(d); err == nil {
			log.Info("removed stale dir", "dir", d, "owner_pid", pid)
		}
	}
}

// Steps are a private server's own lifecycle steps (pgproc, redisproc),
// each called with the server's lock held: Start starts the process and
// waits until it is ready; Stop shuts it down gracefully (SIGKILL when ctx
// ends first); Kill SIGKILLs it; Running reports whether a process is
// still tracked (stop or kill failed to clear it).
type Steps struct {
	Start, Stop func(ctx context.Context) error
	Kill        func() error
	Running     func() bool
}

// Restart is a private server's Restart, called with its lock held: an
// error after Close, else stop the running server (if any) and start it
// again, then log "<name>: restarted" with the port. name prefixes the
// errors ("pgproc").
func Restart(ctx context.Context, name string, closed bool, st Steps, log *slog.Logger, port int) error {
	if closed {
		return fmt.Errorf("%s: restart of closed server", name)
	}
	if err := st.Stop(ctx); err != nil {
		return err
	}
	if err := st.Start(ctx); err != nil {
		return err
	}
	log.Info(name+": restarted", "port", port)
	return nil
}

// Close is a private server's Close, called with its lock held: once only
// (*closed is set; later calls return nil), it stops the server within
// timeout, SIGKILLs whatever is left, then removes dir when it is not ""
// (the directory the server created). name prefixes the errors.
func Close(name string, closed *bool, timeout time.Duration, st Steps, dir string) error {
	if *closed {
		return nil
	}
	*closed = true
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := st.Stop(ctx)
	if st.Running() { // stop failed; make sure nothing is left
		_ = st.Kill()
	}
	if dir != "" {
		if rerr := os.RemoveAll(dir); rerr != nil && err == nil {
			err = fmt.Errorf("%s: remove dir: %w", name, rerr)
		}
	}
	return err
}

// Proc is one started child process of a private server, whose exit is
// watched: Exited is closed once cmd.Wait returned, and Err then holds its
// result. Its methods are safe for concurrent use.
type Proc struct {
	Cmd    *exec.Cmd
	exited chan struct{}
	err    error
}

// Watch returns the Proc of cmd, already started (Start), and waits for it
// in a goroutine of its own.
func Watch(cmd *exec.Cmd) *Proc {
	p := &Proc{Cmd: cmd, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	return p
}

// Exited is closed once the process has exited and been reaped.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Err is cmd.Wait's result; valid once Exited is closed.
func (p *Proc) Err() error { return p.err }

// Alive reports whether p is a process that has not exited (false for nil).
func (p *Proc) Alive() bool {
	if p == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Stop sends sig (the server's graceful shutdown signal) to the process and
// waits until it has exited and, for at most 10 s more, until its process
// group is gone. If ctx ends first it returns ctx.Err() and leaves the
// process running: the caller kills it.
func (p *Proc) Stop(ctx context.Context, sig syscall.Signal) error {
	pid := p.Cmd.Process.Pid
	_ = syscall.Kill(pid, sig)
	select {
	case <-p.exited:
	case <-ctx.Done():
		return ctx.Err()
	}
	WaitGroupGone(pid, 10*time.Second)
	return nil
}

// UnprivilegedCred is the credential a server started by root runs as:
// the "postgres" user, else "nobody" (initdb, postgres and pgbouncer
// refuse to run as root). Errors: neither user exists, or its uid/gid does
// not parse. Safe for concurrent use.
func UnprivilegedCred() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		if u, err = user.Lookup("nobody"); err != nil {
			return nil, fmt.Errorf("running as root and no postgres/nobody user: %w", err)
		}
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("bad uid/gid for user %s", u.Username)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
}
