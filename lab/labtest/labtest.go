// Package labtest is the TestMain of the test binaries that run the lab
// (the lab's packages, cmd/outboxchat, deploy): it builds cmd/outboxchat
// once for the lab to start as the services' processes, runs the tests
// (with outboxtest.Run, so they may use the shared test servers too),
// removes the build and checks for leaked goroutines.
package labtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"github.com/outboxchat/outboxchat/lab/process"
	"github.com/outboxchat/outboxchat/outboxtest"
)

// Main builds github.com/outboxchat/outboxchat/cmd/outboxchat into a
// temporary directory named after prefix, sets process.Binary to it, runs m
// (outboxtest.Run: the shared test servers, if any test used them, are
// stopped after), removes the directory and, when every test passed, fails the run on
// goroutines still alive (goleak.Find; spawn's process loop is expected,
// ignore adds more). It exits the process with the result: call it as the
// whole of TestMain. A failed build exits 1 before any test runs.
func Main(m *testing.M, prefix string, ignore ...goleak.Option) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	process.Binary = filepath.Join(dir, "outboxchat")
	out, err := exec.Command("go", "build", "-o", process.Binary, "github.com/outboxchat/outboxchat/cmd/outboxchat").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build outboxchat: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := outboxtest.Run(m)
	os.RemoveAll(dir)
	if code == 0 {
		opts := append([]goleak.Option{
			goleak.IgnoreTopFunction("github.com/outboxchat/outboxchat/internal/spawn.spawnLoop"),
		}, ignore...)
		if err := goleak.Find(opts...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
