// Package cliflag parses the flag values the binary's commands share in
// shape.
package cliflag

import "strings"

// List splits a comma-separated flag value ("a, b,,c") into its items with
// spaces trimmed and empty ones dropped (["a" "b" "c"]); "" gives nil.
func List(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
