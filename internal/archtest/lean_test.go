package archtest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// maxLibraryModules bounds the module graph of a service that imports the
// library (outbox, redisq, inbox), the service's own module not counted.
const maxLibraryModules = 20

// TestLeanLibraryModule builds what a library user has: a fresh module that
// imports outbox, redisq and inbox from this checkout (a replace), tidied
// with the go command; its module graph (go list -m all) must stay within
// maxLibraryModules. The app, the lab and the CLI live in modules of their
// own so that their dependencies (Prometheus, chromedp, gonum/plot,
// toxiproxy, …) never reach a library user.
func TestLeanLibraryModule(t *testing.T) {
	root, _ := workspace(t)
	rootDir := strings.TrimSpace(string(goCmd(t, ".", "list", "-m", "-f", "{{.Dir}}", root)))
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/libuser\n\ngo 1.26.0\n\nrequire "+root+" v0.0.0\n\nreplace "+root+" => "+rootDir+"\n")
	write("main.go", `package main

import (
	_ "`+root+`/inbox"
	_ "`+root+`/outbox"
	_ "`+root+`/redisq"
)

func main() {}
`)
	t.Setenv("GOWORK", "off")
	t.Setenv("GOFLAGS", "-mod=mod")
	goCmd(t, dir, "mod", "tidy")
	var mods []string
	for line := range strings.Lines(string(goCmd(t, dir, "list", "-m", "all"))) {
		if m := strings.TrimSpace(line); m != "" && m != "example.com/libuser" {
			mods = append(mods, m)
		}
	}
	t.Logf("%d modules:\n%s", len(mods), strings.Join(mods, "\n"))
	if len(mods) > maxLibraryModules {
		t.Errorf("a service importing outbox, redisq and inbox pulls %d modules, want at most %d:\n%s", len(mods), maxLibraryModules, strings.Join(mods, "\n"))
	}
}
