// Package lab runs the outboxchat experiments on real processes: a private
// Postgres and a private Redis (internal/pgproc, internal/redisproc), both
// services as OS processes of this binary (`outboxchat serve`), faults
// injected by signals, restarts and the services' --fault hooks, and an
// invariant checker that reads the database and a WebSocket client.
//
// Entry point: Run, dispatched from `outboxchat lab`. Subcommands:
//
//	up      private servers and both services; prints their URLs; Ctrl-C stops
//	        (--consumers-addr/--workers-addr fix the ports, --keep-logs keeps
//	        the services' logs, --tls runs everything over TLS with a
//	        private CA)
//	chaos   the write-up's fault experiment (--variant v1|v2) or a named
//	        scenario (--scenario NAME, --list)
//	latency the write-up's latency table (v1, v2, v2-intx, v2-poll), the
//	        floors it is bounded by, and a CDF plot
//	bench   sustained end-to-end throughput and latency under load, CPU and
//	        peak RSS per process, Redis memory before and after (--pgbouncer:
//	        the services through a private PgBouncer in transaction mode)
//	demo    chaos v1, chaos v2 and the latency table; fails unless the
//	        results are the expected ones
//
// Invariants the lab keeps:
//   - It never touches servers on the standard ports: every server it starts
//     is private (temp dir, free port on 127.0.0.1) and removed on exit,
//     also when ctx is cancelled (Ctrl-C). Child processes get a parent-death
//     SIGKILL, so they do not outlive the lab even if it is killed.
//   - Reported figures come from the database and the WebSocket watcher,
//     never from the lab's own bookkeeping of what it sent.
//
// Failure modes: a child that does not become ready within its start
// timeout fails the run with the tail of its log; a run that does not
// converge before its deadline reports what it saw (chaos exits 0 and
// reports; demo and the scenarios turn unexpected results into errors).
package lab
