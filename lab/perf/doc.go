// Package perf measures sustained end-to-end throughput and latency of the
// pipeline under load on real processes, with CPU and peak RSS per process,
// Redis memory and Postgres wait events (Bench). The write-up's latency
// table per variant is package latency's.
//
// Performance is measured here and in `go test -bench`, never asserted by a
// unit test.
package perf
