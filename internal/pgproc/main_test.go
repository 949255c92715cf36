package pgproc

import (
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if err := RemoveTemplate(); err != nil && code == 0 {
		code = 1
	}
	os.Exit(code)
}
