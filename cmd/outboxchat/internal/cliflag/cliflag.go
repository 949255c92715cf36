// Package cliflag parses the binary's flags: the FlagSets of its commands,
// and the flag values they share in shape.
package cliflag

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// ParseError is a flag error that Parse has already reported on its
// FlagSet's output, with a hint to run the command with -h. main exits 2
// on one (the flag package's status for bad usage) without printing it
// again.
type ParseError struct {
	Err error // the flag package's error, e.g. "flag provided but not defined: -x"
}

func (e *ParseError) Error() string { return e.Err.Error() }
func (e *ParseError) Unwrap() error { return e.Err }

// Parse parses args with fs, a flag.ContinueOnError FlagSet named for its
// command ("serve", "lab up"). -h prints fs's usage (fs.Usage, or the flag
// package's) and returns flag.ErrHelp, as fs.Parse does. Any other error
// comes back as a *ParseError, which fs has printed, followed by one line
// (not the usage, which buries the error): "run 'outboxchat serve -h' for
// the flags".
func Parse(fs *flag.FlagSet, args []string) error {
	usage := fs.Usage
	if usage == nil {
		usage = func() { // the flag package's own
			fmt.Fprintf(fs.Output(), "Usage of %s:\n", fs.Name())
			fs.PrintDefaults()
		}
	}
	// The flag package calls Usage for -h and after printing an error
	// alike; which to print is decided here, once Parse has returned.
	// Its error is printed here too, once it names what the flag wants.
	fs.Usage = func() {}
	out := fs.Output()
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.SetOutput(out)
	fs.Usage = usage
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		usage()
		return err
	}
	err = wantFormat(fs, err)
	fmt.Fprintln(out, err)
	printHint(fs)
	return &ParseError{Err: err}
}

// badValue matches the flag package's error for a value its flag's type
// cannot parse: "invalid value "x" for flag -n: parse error", and
// "invalid boolean value "x" for -b: parse error".
var badValue = regexp.MustCompile(`(?s)^(invalid (?:boolean )?value ".*" for (?:flag )?-([^\s:]+)): parse error$`)

// wantFormat returns err, the flag package's, with "parse error" replaced
// by what the flag wants ("want a duration such as 5s") when err is about
// a value of a flag of the flag package's own number, duration or bool
// types; otherwise err unchanged.
func wantFormat(fs *flag.FlagSet, err error) error {
	m := badValue.FindStringSubmatch(err.Error())
	if m == nil {
		return err
	}
	f := fs.Lookup(m[2])
	if f == nil {
		return err
	}
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return err
	}
	// The flag's default is the example, unless it is its type's zero
	// (or hidden as one: HideDefault).
	example := func(zero, other string) string {
		if f.DefValue != zero && f.DefValue != "" {
			return f.DefValue
		}
		return other
	}
	var want string
	switch g.Get().(type) {
	case time.Duration:
		want = "want a duration such as " + example("0s", "5s") + " (a number and a unit: ms, s, m, h)"
	case int, int64:
		want = "want an integer such as " + example("0", "10")
	case uint, uint64:
		want = "want a whole number, 0 or more, such as " + example("0", "10")
	case float64:
		want = "want a number such as " + example("0", "0.5")
	case bool:
		want = "want true or false"
	default:
		return err
	}
	return fmt.Errorf("%s: %s", m[1], want)
}

// Usagef reports a command line that parsed but will not do (a required
// flag missing, a value the command refuses) as Parse reports a flag
// error: it prints the message formatted from format and args, then the
// same hint line, to fs's output, and returns it as a *ParseError (exit 2,
// printed already).
func Usagef(fs *flag.FlagSet, format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	fmt.Fprintln(fs.Output(), err)
	printHint(fs)
	return &ParseError{Err: err}
}

// printHint prints the line that follows a flag error on fs's output.
func printHint(fs *flag.FlagSet) {
	fmt.Fprintf(fs.Output(), "run 'outboxchat %s -h' for the flags\n", fs.Name())
}

// EnvString defines a string flag on fs whose default is environment
// variable env's value ("" when unset). usage must say so, e.g. "Redis URL
// (default $REDIS_URL)": the usage prints no other default (HideDefault),
// so -h shows neither the variable's value twice nor a password in it.
func EnvString(fs *flag.FlagSet, name, env, usage string) *string {
	p := fs.String(name, os.Getenv(env), usage)
	HideDefault(fs, name)
	return p
}

// EnvInt defines an int flag on fs whose default is environment variable
// env's value, or def when it is unset or not an integer (the flag then
// reports nothing: the command checks the value's range). usage must say
// so, e.g. "(default $OUTBOXCHAT_PARTITIONS, else 1)": the usage prints no
// other default (HideDefault).
func EnvInt(fs *flag.FlagSet, name, env string, def int, usage string) *int {
	if n, err := strconv.Atoi(strings.TrimSpace(os.Getenv(env))); err == nil {
		def = n
	}
	p := fs.Int(name, def, usage)
	HideDefault(fs, name)
	return p
}

// HideDefault keeps fs's usage from printing "(default …)" after flag
// name's usage text, for a flag whose text states its default in words:
// one taken from an environment variable, or a sentinel value that stands
// for a default worked out later (serve's --redrive-after -1: "2 ×
// --lock-duration"). flag.PrintDefaults leaves the default out when a
// flag's DefValue is its type's zero value; HideDefault sets DefValue so.
// The flag's value is unchanged. It panics if fs has no flag name.
func HideDefault(fs *flag.FlagSet, name string) {
	f := fs.Lookup(name)
	if f == nil {
		panic("cliflag: HideDefault: no flag -" + name)
	}
	// The zero value of the flag's type, made as flag.PrintDefaults makes
	// it to compare DefValue with.
	t := reflect.TypeOf(f.Value)
	var z reflect.Value
	if t.Kind() == reflect.Pointer {
		z = reflect.New(t.Elem())
	} else {
		z = reflect.Zero(t)
	}
	f.DefValue = z.Interface().(flag.Value).String()
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
