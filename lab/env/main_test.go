package env_test

import (
	"testing"

	"go.uber.org/goleak"
)

// toxiproxy v2.5.0 can leave a link's reader and its toxic stubs blocked on
// a channel send after Proxy.Stop closed their connections: the library's,
// a few per stopped proxy, never running again.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).read"),
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run"),
	)
}
