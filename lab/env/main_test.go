package env_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/outboxchat/outboxchat/lab/labtest"
)

// TestMain builds the outboxchat binary once: the lab starts it as the
// services' processes.
func TestMain(m *testing.M) {
	labtest.Main(m, "lab-test-",
		// toxiproxy v2.5.0 (lab torture's network faults) can leave a
		// link's reader and its toxic stubs blocked on a channel send
		// after Proxy.Stop closed their connections: the library's,
		// a few per stopped proxy, never running again.
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).read"),
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run"),
	)
}
