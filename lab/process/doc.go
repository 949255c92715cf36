// Package process supervises the lab's service processes: each an
// `outboxchat serve` OS process (Proc) started with its arguments, its
// JSON log read line by line (Subscribe, for the services' typed events),
// waited on until /readyz answers, signalled (SIGKILL, SIGTERM,
// SIGSTOP/SIGCONT), restarted, and measured (peak RSS and CPU time from
// /proc, TreeCPU for servers and their children). lab/env builds the
// environment from them; the experiments use them to inject faults.
//
// Processes get a parent-death SIGKILL (internal/spawn), so they do not
// outlive the lab even if it is killed.
package process
