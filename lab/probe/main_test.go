package probe

import (
	"testing"

	"github.com/outboxchat/outboxchat/lab/labtest"
)

// TestMain builds the outboxchat binary once: the tests start it as the
// services' processes.
func TestMain(m *testing.M) { labtest.Main(m, "lab-probe-test-") }
