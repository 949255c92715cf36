package testenv

import (
	"os"
	"path/filepath"
	"testing"
)

// WriteFile writes data to a file called name in a fresh t.TempDir,
// readable by its owner only (0600, as secret and key files must be), and
// returns the file's path. It fails the test (t.Fatal) when the write
// fails. The directory is removed when the test ends.
func WriteFile(t testing.TB, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
