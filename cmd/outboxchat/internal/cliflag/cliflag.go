// Package cliflag parses the binary's flags: the FlagSets of its commands,
// and the flag values they share in shape.
package cliflag

import (
	"errors"
	"flag"
	"strings"
)

// ParseError is a flag error that Parse has already reported, with the
// usage, on its FlagSet's output. main exits 2 on one (the flag package's
// status for bad usage) without printing it again.
type ParseError struct {
	Err error // the flag package's error, e.g. "flag provided but not defined: -x"
}

func (e *ParseError) Error() string { return e.Err.Error() }
func (e *ParseError) Unwrap() error { return e.Err }

// Parse parses args with fs, a flag.ContinueOnError FlagSet. -h returns
// flag.ErrHelp as fs.Parse does; any other error, which fs has printed
// with its usage, comes back as a *ParseError.
func Parse(fs *flag.FlagSet, args []string) error {
	err := fs.Parse(args)
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return err
	}
	return &ParseError{Err: err}
}

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
