package server

import (
	"github.com/outboxchat/outboxchat/inbox"
	"github.com/outboxchat/outboxchat/outbox"
)

// Hooks lets the caller of Serve wrap the three steps of the pipeline where
// a process can die with a message half handled: the relay's publish, the
// worker's read and acknowledgement of stream entries (Source), and the
// worker's inbox statement (Handler). The lab uses it to inject crashes
// (package lab/fault, `serve --fault`); tests use it to inject
// errors. Production passes none (Config.Hooks nil).
//
// Each method is called once, while Serve builds its services, with the
// part it may wrap, and returns the part to use (the argument itself to
// leave it alone). The parts returned are called concurrently, as the
// wrapped ones are.
type Hooks interface {
	// Publisher wraps the relay role's publisher (outbox → Redis stream).
	Publisher(outbox.Publisher) outbox.Publisher
	// Source wraps the worker role's stream source (fetch, ack).
	Source(inbox.Source) inbox.Source
	// Handler wraps the worker role's inbox handler.
	Handler(inbox.Handler) inbox.Handler
}
