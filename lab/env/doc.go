// Package env is the lab's environment: a private Postgres and a private
// Redis (internal/pgproc, internal/redisproc; optionally a PgBouncer, a
// Sentinel-managed replica, TLS with a private CA), both services as OS
// processes of the outboxchat binary (`outboxchat serve`, supervised by
// lab/process), in-process toxiproxy links between them (Links), and the faults
// injected into all of it (Env.Inject, in the lab/fault vocabulary).
//
// Invariants:
//   - It never touches servers on the standard ports: every server it
//     starts is private (temp dir, free port on 127.0.0.1) and removed by
//     Env.Close, also when the caller's context is cancelled (Ctrl-C).
//     Child processes get a parent-death SIGKILL, so they do not outlive
//     the lab even if it is killed.
//   - A child that does not become ready within its start timeout fails
//     Start with the tail of its log.
package env
