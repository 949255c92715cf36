// Package spawn starts the child processes of the tests and the lab
// (postgres, redis-server, pgbouncer, outboxchat) so that they die with the
// Go process that started them, and holds what the private servers share:
// the executable and common options of a server (Program, Settings), the
// lifecycle of a server's process (Server: start, stop, kill, restart,
// close), its readiness wait, and the port and directory helpers.
package spawn

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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

// FreeStablePort is FreePort for a port a server must bind again after a
// crash (a cluster node's bus port): it picks a free TCP port on 127.0.0.1
// at random below the kernel's ephemeral range (ip_local_port_range, from
// port 20000 up), where no outgoing connection's local port can take it
// while the server is down. It falls back to FreePort when that range is
// too small or unreadable, or after 100 ports found taken. The port is
// released before returning: callers retry on bind failure.
func FreeStablePort() (int, error) {
	lo := 20000
	hi := ephemeralLow()
	if hi-lo < 1000 {
		return FreePort()
	}
	for range 100 {
		p := lo + rand.IntN(hi-lo)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		_ = l.Close()
		return p, nil
	}
	return FreePort()
}

// ephemeralLow returns the first port of the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range), 0 when unreadable.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(f[0])
	return n
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
	found := false
	err := eachProc(func(_ int, st procStat) bool {
		found = st.live() && st.pgrp == pgid
		return !found
	})
	return found || err != nil // /proc unreadable: assume alive
}

// Alive reports whether pid exists and is not a zombie.
func Alive(pid int) bool {
	st, ok := readStat(pid)
	return ok && st.live()
}

// Descendants returns the live descendants of root, found via /proc.
func Descendants(root int) []int {
	children := map[int][]int{}
	_ = eachProc(func(pid int, st procStat) bool {
		if st.live() {
			children[st.ppid] = append(children[st.ppid], pid)
		}
		return true
	})
	var out []int
	queue := []int{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

// procStat is what /proc/PID/stat says of a process.
type procStat struct {
	state      string // "R", "S", "Z" (zombie), "X" (dead), …
	ppid, pgrp int
}

func (st procStat) live() bool { return st.state != "Z" && st.state != "X" }

// readStat reads /proc/pid/stat.
func readStat(pid int) (procStat, bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return procStat{}, false
	}
	// Format: pid (comm) state ppid pgrp ...; comm may contain spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 3 {
		return procStat{}, false
	}
	ppid, _ := strconv.Atoi(f[1])
	pgrp, _ := strconv.Atoi(f[2])
	return procStat{state: f[0], ppid: ppid, pgrp: pgrp}, true
}

// eachProc calls f with every process in /proc until f returns false. The
// error is ReadDir's, when /proc cannot be read.
func eachProc(f func(pid int, st procStat) bool) error {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := readStat(pid); ok && !f(pid, st) {
			return nil
		}
	}
	return nil
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

// TailSince returns what the file at path got after offset off (its size
// before a start), for an error message; the last 4 KiB of the file when
// that is longer or the file shrank.
func TailSince(path string, off int64) string {
	if b, err := os.ReadFile(path); err == nil && int64(len(b)) >= off {
		if s := strings.TrimSpace(string(b[off:])); len(s) <= 4096 {
			return s
		}
	}
	return TailFile(path, 4096)
}

// OwnerFile is the name of the file, written into every temp dir that the
// private servers and the lab create, holding the pid of the creating Go
// process. If that process dies without Close (SIGKILL, test timeout), Pdeathsig kills the server but the dir stays behind;
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

// WaitReady calls probe every interval until it returns nil (the server
// serves), the process exits, or ctx ends or timeout passes; the error says
// which, with probe's last error.
func (p *Proc) WaitReady(ctx context.Context, timeout, interval time.Duration, probe func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		last := probe(ctx)
		if last == nil {
			return nil
		}
		t := time.NewTimer(interval)
		select {
		case <-p.exited:
			t.Stop()
			return fmt.Errorf("%s exited: %v", filepath.Base(p.Cmd.Path), p.err)
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), last)
		case <-t.C:
		}
	}
}

// Kill SIGKILLs the process's group and waits until the process is reaped
// and, for at most 10 s, until no member of its group is alive; it returns
// an error when one still is.
func (p *Proc) Kill() error {
	pid := p.Cmd.Process.Pid
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	<-p.exited
	if !WaitGroupGone(pid, 10*time.Second) {
		return fmt.Errorf("processes of group %d still alive after SIGKILL", pid)
	}
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
