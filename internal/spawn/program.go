package spawn

import (
	"fmt"
	"log/slog"
	"time"
)

// Program is the executable of a private server: Name on PATH, else the
// file Fallback. Owner, the package that runs it ("redisproc"), prefixes
// the errors. A Program is a plain value, safe to share.
type Program struct {
	Owner, Name, Fallback string
	// Hint, when not "", is added to Available's error (how to install
	// it).
	Hint string
}

// Path returns the executable's path (Binary): Fallback, with an error,
// when neither is an executable file.
func (p Program) Path() (string, error) { return Binary(p.Name, p.Fallback) }

// Available reports why the server cannot run on this machine: nil when
// the executable is found. It starts nothing and is safe for concurrent
// use.
func (p Program) Available() error {
	if _, err := p.Path(); err != nil {
		if p.Hint != "" {
			return fmt.Errorf("%s: %w (%s)", p.Owner, err, p.Hint)
		}
		return fmt.Errorf("%s: %w", p.Owner, err)
	}
	return nil
}

// Settings are the options every private server takes.
type Settings struct {
	// Logger receives lifecycle lines; nil discards them.
	Logger *slog.Logger
	// StartTimeout bounds a start's wait until the server serves.
	StartTimeout time.Duration
	// Binary is the executable's path.
	Binary string
}

// WithDefaults returns s with its zero fields filled: a logger that
// discards, StartTimeout timeout (for a value ≤ 0), and Binary p's Path
// (a missing executable then fails the start with its error; left "" by
// the zero Program).
func (p Program) WithDefaults(s Settings, timeout time.Duration) Settings {
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	if s.StartTimeout <= 0 {
		s.StartTimeout = timeout
	}
	if s.Binary == "" && p.Name != "" {
		s.Binary, _ = p.Path()
	}
	return s
}
