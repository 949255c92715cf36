package lab

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
)

// TestMain builds the outboxchat binary once: the lab starts it as the
// services' processes.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "lab-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	Binary = filepath.Join(dir, "outboxchat")
	out, err := exec.Command("go", "build", "-o", Binary, "../cmd/outboxchat").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build outboxchat: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(
			goleak.IgnoreTopFunction("github.com/outboxchat/outboxchat/internal/spawn.spawnLoop"),
			// toxiproxy v2.5.0 (lab torture's network faults) can leave a
			// link's reader and its toxic stubs blocked on a channel send
			// after Proxy.Stop closed their connections: the library's,
			// a few per stopped proxy, never running again.
			goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).read"),
			goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run"),
		); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
