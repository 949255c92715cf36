package archtest

import (
	"fmt"
	"slices"
	"strings"
)

// A Package is one node of the import graph, as go list reports it.
type Package struct {
	// ImportPath is the package's full import path.
	ImportPath string
	// Imports are the full import paths its non-test files import.
	Imports []string
	// TestImports are those its test files import (in-package and external
	// test package together).
	TestImports []string
	// Decls are the top-level identifiers its non-test files declare
	// (types, funcs, consts, vars; a method as "Recv.Name").
	Decls []string
	// Embeds are the files its non-test files embed (go:embed), relative
	// to its directory.
	Embeds []string
}

// Rules are the tables a graph is checked against.
type Rules struct {
	Layers       map[string]Layer
	Places       []Place
	Interims     []Interim
	Confinements []Confinement
}

// Project returns the project's rules: Layers, Places, Interims and
// Confinements.
func Project() Rules {
	return Rules{Layers: Layers, Places: Places, Interims: Interims, Confinements: Confinements}
}

// Validate reports what is wrong with the tables themselves: a layer
// named but not defined, or an Interim whose ends are placed nowhere. nil
// when they are consistent.
func (r Rules) Validate() []string {
	var out []string
	known := func(where, l string) {
		if _, ok := r.Layers[l]; !ok {
			out = append(out, fmt.Sprintf("%s names layer %q, which Layers does not define", where, l))
		}
	}
	for _, p := range r.Places {
		known("place "+p.Pattern, p.Layer)
	}
	for name, l := range r.Layers {
		for _, m := range l.May {
			known("layer "+name+" (May)", m)
		}
		for _, m := range l.TestMay {
			known("layer "+name+" (TestMay)", m)
		}
	}
	for _, c := range r.Confinements {
		for _, l := range c.Outside {
			known("confinement of "+c.Word, l)
		}
	}
	for _, in := range r.Interims {
		for _, p := range []string{in.From, in.To, in.Until} {
			if _, ok := r.place(p); !ok {
				out = append(out, fmt.Sprintf("interim %s → %s: %s is placed in no layer", in.From, in.To, p))
			}
		}
	}
	slices.Sort(out)
	return out
}

// Check returns one line per violation in pkgs, sorted; nil when the graph
// keeps the rules. root is the import path of the project's root module;
// packages and imports outside it are not the project's. Violations: a
// package placed in no layer, an import the importer's layer does not
// allow (named as "from → to", "(test)" when only a test file imports it),
// an Interim that has ended (its Until package exists) but is still in
// the table, and a declaration or embedded file a Confinement keeps out of
// the package's layer.
func (r Rules) Check(root string, pkgs []Package) []string {
	exists := map[string]bool{}
	for _, p := range pkgs {
		if rel, ok := relPath(root, p.ImportPath); ok {
			exists[rel] = true
		}
	}
	var out []string
	for _, p := range pkgs {
		from, ok := relPath(root, p.ImportPath)
		if !ok {
			continue
		}
		layer, ok := r.place(from)
		if !ok {
			out = append(out, fmt.Sprintf("package %s is placed in no layer: give it one in Places (internal/archtest/rules.go)", from))
			continue
		}
		out = append(out, r.unconfined(from, layer, p)...)
		l := r.Layers[layer]
		seen := map[string]bool{}
		for _, imp := range p.Imports {
			seen[imp] = true
			if why := r.forbidden(root, from, layer, l.May, l.External, imp, exists); why != "" {
				out = append(out, fmt.Sprintf("%s → %s: %s", from, display(root, imp), why))
			}
		}
		testMay := join(l.May, l.TestMay)
		for _, imp := range p.TestImports {
			if seen[imp] {
				continue // reported (or allowed) as a non-test import
			}
			if why := r.forbidden(root, from, layer, testMay, l.External, imp, exists); why != "" {
				out = append(out, fmt.Sprintf("%s (test) → %s: %s", from, display(root, imp), why))
			}
		}
	}
	for _, in := range r.Interims {
		if exists[in.Until] {
			out = append(out, fmt.Sprintf("interim %s → %s has ended (%s exists): remove it from Interims", in.From, in.To, in.Until))
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// unconfined returns one line per declaration or embedded file of p (at
// rel, in layer) that a Confinement keeps out of layer.
func (r Rules) unconfined(rel, layer string, p Package) []string {
	var out []string
	for _, c := range r.Confinements {
		if !slices.Contains(c.Outside, layer) {
			continue
		}
		word := strings.ToLower(c.Word)
		for _, d := range p.Decls {
			if strings.Contains(strings.ToLower(d), word) {
				out = append(out, fmt.Sprintf("%s declares %s: layer %s may have no %s (%s)", rel, d, layer, c.Word, c.Why))
			}
		}
		for _, e := range p.Embeds {
			if strings.Contains(strings.ToLower(e), word) {
				out = append(out, fmt.Sprintf("%s embeds %s: layer %s may have no %s (%s)", rel, e, layer, c.Word, c.Why))
			}
		}
	}
	return out
}

// forbidden returns why from (in layer, allowed the layers may and the
// modules external) may not import imp, or "" when it may.
func (r Rules) forbidden(root, from, layer string, may, external []string, imp string, exists map[string]bool) string {
	to, ok := relPath(root, imp)
	if !ok {
		if isStd(imp) || external == nil {
			return ""
		}
		for _, m := range external {
			if imp == m || strings.HasPrefix(imp, m+"/") {
				return ""
			}
		}
		return fmt.Sprintf("layer %s may use no module outside the standard library but %s", layer, orNone(external))
	}
	if to == from {
		return ""
	}
	toLayer, ok := r.place(to)
	if !ok {
		return to + " is placed in no layer"
	}
	if slices.Contains(may, toLayer) {
		return ""
	}
	for _, in := range r.Interims {
		if in.From == from && in.To == to && !exists[in.Until] {
			return ""
		}
	}
	return fmt.Sprintf("layer %s may not import layer %s (it may import %s)", layer, toLayer, orNone(may))
}

// place returns the layer of the package at rel (relative to the root
// module): that of the longest pattern in Places that matches it.
func (r Rules) place(rel string) (string, bool) {
	best, layer := -1, ""
	for _, p := range r.Places {
		if matches(p.Pattern, rel) && len(p.Pattern) > best {
			best, layer = len(p.Pattern), p.Layer
		}
	}
	return layer, best >= 0
}

// matches reports whether pattern ("x" or "x/...") matches the package
// path rel.
func matches(pattern, rel string) bool {
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return rel == base || strings.HasPrefix(rel, base+"/")
	}
	return rel == pattern
}

// relPath returns path relative to the root module ("." for the root
// package itself), and false for a path outside it.
func relPath(root, path string) (string, bool) {
	if path == root {
		return ".", true
	}
	rel, ok := strings.CutPrefix(path, root+"/")
	return rel, ok
}

// display is imp relative to root when it is the project's, else imp.
func display(root, imp string) string {
	if rel, ok := relPath(root, imp); ok {
		return rel
	}
	return imp
}

// isStd reports whether path is a standard library package: its first
// element has no dot.
func isStd(path string) bool {
	first, _, _ := strings.Cut(path, "/")
	return !strings.Contains(first, ".")
}

func orNone(list []string) string {
	if len(list) == 0 {
		return "none"
	}
	return strings.Join(list, ", ")
}
