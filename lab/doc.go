// Package lab is the home of the outboxchat experiments, which run on real
// processes: private Postgres and Redis servers, both services as OS
// processes of the outboxchat binary, faults injected by signals, restarts,
// proxies and the services' --fault hooks, and checks that read the
// database and WebSocket clients. It holds no code; its parts are:
//
//	lab/env       the environment: private servers, service processes, toxiproxy links, fault injection
//	lab/process   the service processes: started, read, signalled, restarted, measured
//	lab/fault     the one vocabulary of faults, and the crash points of `serve --fault`
//	lab/probe     what observes it: WebSocket watchers, senders, the stream tap, figures, event log, stats
//	lab/chaos     the write-up's fault experiment (v1, v2)
//	lab/scenario  named fault scenarios, each checking the invariants
//	lab/torture   random fault schedules with an independent checker
//	lab/latency   the latency table, its floors and its CDF plot
//	lab/perf      the load bench
//	lab/labtest   the TestMain of test binaries that run the lab
//
// The commands (`outboxchat lab up|chaos|scenario|latency|bench|demo|torture`)
// parse their flags in cmd/outboxchat and call these packages with plain
// option structs.
package lab
