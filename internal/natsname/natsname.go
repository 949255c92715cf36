// Package natsname holds the one character class of JetStream stream and
// consumer names that this repository uses: ASCII letters, digits, '-' and
// '_'. NATS itself refuses fewer characters (whitespace, '.', '*', '>',
// path separators; see the NATS docs on naming streams and consumers);
// the narrower class keeps every name also a safe file and subject token.
package natsname

import "strings"

// char reports whether r may appear in a name.
func char(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_'
}

// Valid reports whether s is a non-empty name of the class's characters
// only. Safe for concurrent use.
func Valid(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !char(r) {
			return false
		}
	}
	return true
}

// Safe returns s with every character outside the class replaced by '_'
// ("" stays ""). Safe for concurrent use.
func Safe(s string) string {
	return strings.Map(func(r rune) rune {
		if char(r) {
			return r
		}
		return '_'
	}, s)
}
