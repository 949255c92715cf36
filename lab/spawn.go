package lab

import (
	"net"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// Child processes are started from one goroutine locked to its OS thread
// for the life of the process: the Linux parent-death signal fires when the
// *thread* that forked the child exits, and the Go runtime may retire
// threads. With the spawner thread living as long as the lab, Pdeathsig
// (SIGKILL) makes every child die with the lab, even when the lab itself is
// SIGKILLed. Same design as internal/pgproc and internal/redisproc.

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

var (
	spawnOnce sync.Once
	spawnCh   chan spawnReq
)

func spawnLoop(ch <-chan spawnReq) {
	runtime.LockOSThread()
	for r := range ch {
		r.done <- r.cmd.Start()
	}
}

// startCmd starts cmd in its own process group (Ctrl-C on the terminal
// reaches only the lab, which then stops its children in order) with a
// parent-death signal of SIGKILL.
func startCmd(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	spawnOnce.Do(func() {
		spawnCh = make(chan spawnReq)
		go spawnLoop(spawnCh)
	})
	done := make(chan error, 1)
	spawnCh <- spawnReq{cmd: cmd, done: done}
	return <-done
}

// freeAddr returns "127.0.0.1:PORT" for a port that was free a moment ago.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
