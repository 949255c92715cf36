// Package fault is the lab's one vocabulary of faults: what can go wrong
// with a running environment (a service process killed, stopped or
// crashing at a chosen step, Redis or Postgres going down, a network link
// degraded) as a Fault value that the experiments draw, print and inject
// (lab/env.Env.Inject), and the crash points a service process can be
// started with (`outboxchat serve --fault KIND:SEQ`, ParseCrash).
//
// The crash points kill the process with SIGKILL — a crash, not a
// shutdown — at one step, the first time a message with the given seq
// passes it:
//
//	worker-crash-after-commit:SEQ   after the inbox commit, before XACK
//	worker-crash-before-commit:SEQ  after the worker read the job, before the inbox commit
//	relay-crash-after-publish:SEQ   after the relay's publish, before its commit
//
// Just before the kill the process logs one event line (chat.EventLogMsg,
// with chat.EventKey = EventCrash and attributes fault, seq), which the lab
// reads. A restarted process must be started without the fault, or it
// crashes again at the same step. Package chat knows nothing of faults: the
// parsed Crash reaches it as chat.Hooks, and a process started without
// --fault never loads one.
package fault
