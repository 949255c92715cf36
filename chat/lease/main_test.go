package lease

import (
	"testing"

	"github.com/outboxchat/outboxchat/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }
