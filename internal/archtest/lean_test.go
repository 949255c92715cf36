package archtest

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// maxLibraryBuildModules bounds the modules whose packages a service that
// imports the library (outbox, redisq, inbox) compiles in.
const maxLibraryBuildModules = 20

// libraryMayAdd are the modules the library may add to the module graph of
// its two drivers, pgx and go-redis: uuid (the test kit's message ids) and
// goleak (the test kit's leak check).
var libraryMayAdd = []string{"github.com/google/uuid", "go.uber.org/goleak"}

// TestLeanLibraryModule builds what a library user has: a fresh module that
// imports outbox, redisq and inbox from this checkout (a replace), tidied
// by the go command. Its build may compile in at most
// maxLibraryBuildModules modules, and its module graph (go list -m all) may
// hold nothing beyond what a module importing only pgx and go-redis, at
// the library's versions, already holds — their own go.mod files bring
// about two dozen modules, test frameworks among them — and
// libraryMayAdd. The app, the lab and the CLI live in modules of their own
// so that their dependencies (Prometheus, chromedp, gonum/plot,
// toxiproxy, …) never reach a library user.
func TestLeanLibraryModule(t *testing.T) {
	root, _ := workspace(t)
	t.Setenv("GOWORK", "off")
	t.Setenv("GOFLAGS", "-mod=mod")
	rootDir := strings.TrimSpace(string(goCmd(t, ".", "list", "-m", "-f", "{{.Dir}}")))
	version := func(mod string) string {
		return strings.TrimSpace(string(goCmd(t, rootDir, "list", "-m", "-f", "{{.Version}}", mod)))
	}
	user := tempModule(t, "example.com/libuser",
		"require "+root+" v0.0.0\n\nreplace "+root+" => "+rootDir+"\n",
		root+"/inbox", root+"/outbox", root+"/redisq")
	bare := tempModule(t, "example.com/bare",
		"require (\n\tgithub.com/jackc/pgx/v5 "+version("github.com/jackc/pgx/v5")+
			"\n\tgithub.com/redis/go-redis/v9 "+version("github.com/redis/go-redis/v9")+"\n)\n",
		"github.com/jackc/pgx/v5/pgxpool", "github.com/redis/go-redis/v9")

	var built []string
	for line := range strings.Lines(string(goCmd(t, user, "list", "-deps", "-f", "{{with .Module}}{{.Path}}{{end}}", "."))) {
		if m := strings.TrimSpace(line); m != "" && m != "example.com/libuser" && !slices.Contains(built, m) {
			built = append(built, m)
		}
	}
	t.Logf("the build compiles in %d modules: %s", len(built), strings.Join(built, " "))
	if len(built) > maxLibraryBuildModules {
		t.Errorf("a service importing outbox, redisq and inbox compiles in %d modules, want at most %d", len(built), maxLibraryBuildModules)
	}

	floor := graph(t, bare)
	var extra []string
	for _, m := range graph(t, user) {
		if m != "example.com/libuser" && m != root && !slices.Contains(floor, m) && !slices.Contains(libraryMayAdd, m) {
			extra = append(extra, m)
		}
	}
	t.Logf("module graph: pgx and go-redis alone hold %d modules", len(floor)-1)
	if len(extra) > 0 {
		t.Errorf("the library adds to the module graph of pgx and go-redis: %s (allowed: %s)", strings.Join(extra, ", "), strings.Join(libraryMayAdd, ", "))
	}
}

// tempModule writes a module named name with the go.mod tail requires and
// a main package that imports imports, tidies it, and returns its dir.
func tempModule(t *testing.T, name, requires string, imports ...string) string {
	t.Helper()
	dir := t.TempDir()
	var src strings.Builder
	src.WriteString("package main\n\nimport (\n")
	for _, p := range imports {
		src.WriteString("\t_ \"" + p + "\"\n")
	}
	src.WriteString(")\n\nfunc main() {}\n")
	for name, body := range map[string]string{
		"go.mod":  "module " + name + "\n\ngo 1.26.0\n\n" + requires,
		"main.go": src.String(),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	goCmd(t, dir, "mod", "tidy")
	return dir
}

// graph returns the module paths of go list -m all in dir.
func graph(t *testing.T, dir string) []string {
	t.Helper()
	var mods []string
	for line := range strings.Lines(string(goCmd(t, dir, "list", "-m", "-f", "{{.Path}}", "all"))) {
		if m := strings.TrimSpace(line); m != "" {
			mods = append(mods, m)
		}
	}
	return mods
}
