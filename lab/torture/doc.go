// Package torture runs random fault schedules against real processes and
// checks the outcome with a checker independent of the services (Run).
//
// Each schedule K of a seed S draws (schedule.go) a topology (one process
// per service, a separate relay, or two API processes and two relays per
// service), a load shape and a sequence of faults in the lab/fault
// vocabulary; the same (S, K) always draws the same schedule, so a failure
// is replayed with `outboxchat lab torture --seed S --schedule K` and
// shrunk with --shrink. A run (run.go) starts a fresh environment with
// every link behind a toxiproxy proxy, sends both ways through random API
// processes, drops and reconnects WebSocket clients at random, taps both
// streams through a consumer group of its own, and applies the faults
// (faults.go). Then everything is healed, the system must drain within the
// drain bound, and the checker (check.go) reads the databases, the tap and
// every client's frames: every 201 send in the receiver's inbox once, no
// frame twice on one connection, seqs rising, every stored seq shown,
// stream entries in seq order, no entry acknowledged before its inbox
// commit, dead letters only for the malformed entries injected.
package torture
