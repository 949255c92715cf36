package archtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestImportGraph checks every package of every module in the workspace
// against the rules.
func TestImportGraph(t *testing.T) {
	if problems := Project().Validate(); len(problems) > 0 {
		t.Fatalf("the rule tables are inconsistent:\n%s", strings.Join(problems, "\n"))
	}
	root, dirs := workspace(t)
	pkgs := load(t, dirs)
	t.Logf("root module %s: %d packages in %d module(s)", root, len(pkgs), len(dirs))
	if len(pkgs) == 0 {
		t.Fatal("go list found no packages")
	}
	for _, p := range Project().Check(root, pkgs) {
		t.Error(p)
	}
}

// workspace returns the import path of the module that holds this test
// (the project's root module) and the directories of every module in the
// workspace (just that module's without a go.work).
func workspace(t *testing.T) (root string, dirs []string) {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	out := goCmd(t, wd, "list", "-m", "-f", "{{.Path}}\t{{.Dir}}")
	var paths []string
	best := -1
	for line := range strings.Lines(string(out)) {
		path, dir, ok := strings.Cut(strings.TrimSpace(line), "\t")
		if !ok || dir == "" {
			continue
		}
		paths, dirs = append(paths, path), append(dirs, dir)
		if within(wd, dir) && len(dir) > best {
			best, root = len(dir), path
		}
	}
	if root == "" {
		t.Fatalf("no module of the workspace holds %s:\n%s", wd, out)
	}
	for _, p := range paths {
		if p != root && !strings.HasPrefix(p, root+"/") {
			t.Fatalf("module %s is not below the root module %s: the rules place packages by their path below it", p, root)
		}
	}
	return root, dirs
}

// within reports whether dir is base or below it.
func within(dir, base string) bool {
	rel, err := filepath.Rel(base, dir)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// load returns the packages of the modules in dirs (each package once),
// from go list -json: their imports, their test files' imports, their
// embedded files, and the top-level names their non-test files declare.
func load(t *testing.T, dirs []string) []Package {
	t.Helper()
	var pkgs []Package
	seen := map[string]bool{}
	for _, dir := range dirs {
		dec := json.NewDecoder(bytes.NewReader(goCmd(t, dir, "list", "-e", "-deps=false", "-json=ImportPath,Dir,GoFiles,EmbedFiles,Imports,TestImports,XTestImports,Error", "./...")))
		for {
			var p struct {
				ImportPath, Dir                    string
				GoFiles, EmbedFiles                []string
				Imports, TestImports, XTestImports []string
				Error                              *struct{ Err string }
			}
			err := dec.Decode(&p)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("go list in %s: %v", dir, err)
			}
			if p.Error != nil {
				t.Errorf("go list: package %s: %s", p.ImportPath, p.Error.Err)
			}
			if seen[p.ImportPath] {
				continue
			}
			seen[p.ImportPath] = true
			pkgs = append(pkgs, Package{ImportPath: p.ImportPath, Imports: p.Imports, TestImports: append(p.TestImports, p.XTestImports...),
				Decls: decls(t, p.Dir, p.GoFiles), Embeds: p.EmbedFiles})
		}
	}
	return pkgs
}

// decls returns the top-level identifiers the files (in dir) declare, a
// method as "Recv.Name".
func decls(t *testing.T, dir string, files []string) []string {
	t.Helper()
	var out []string
	fset := token.NewFileSet()
	for _, name := range files {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatalf("parsing %s: %v", filepath.Join(dir, name), err)
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				out = append(out, recvName(d)+d.Name.Name)
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						out = append(out, s.Name.Name)
					case *ast.ValueSpec:
						for _, n := range s.Names {
							out = append(out, n.Name)
						}
					}
				}
			}
		}
	}
	return out
}

// recvName is "Recv." for a method (its receiver's type name, without
// pointer or type parameters), "" for a func.
func recvName(d *ast.FuncDecl) string {
	if d.Recv == nil || len(d.Recv.List) == 0 {
		return ""
	}
	e := d.Recv.List[0].Type
	if s, ok := e.(*ast.StarExpr); ok {
		e = s.X
	}
	switch x := e.(type) {
	case *ast.IndexExpr:
		e = x.X
	case *ast.IndexListExpr:
		e = x.X
	}
	if id, ok := e.(*ast.Ident); ok {
		return id.Name + "."
	}
	return ""
}

// goCmd runs the go command in dir and returns its standard output.
func goCmd(t *testing.T, dir string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), dir, err, stderr.Bytes())
	}
	return out
}
