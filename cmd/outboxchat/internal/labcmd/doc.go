// Package labcmd is the `outboxchat lab` commands: each one parses its flags
// and calls a lab package (lab/env, lab/chaos, lab/scenario, lab/latency,
// lab/perf, lab/torture) with a plain option struct.
//
// Every command has the shape func(ctx, args, stdout, stderr) error: args
// are the arguments after "lab NAME"; the report goes to stdout, progress
// and flag errors to stderr; -h returns flag.ErrHelp, bad flags a
// *cliflag.ParseError (printed already, with a hint to run -h), failed runs
// an error. A command runs until its work is done or ctx ends. Usage
// is the `outboxchat lab` usage text.
package labcmd
