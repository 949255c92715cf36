// Package perf measures the pipeline on real processes: the write-up's
// latency table per variant (Latency: send call → frame at a WebSocket
// client of the other service, with the round trips that bound it from
// below, Floors, and a CDF plot), and sustained end-to-end throughput and
// latency under load with CPU and peak RSS per process, Redis memory and
// Postgres wait events (Bench).
//
// Performance is measured here and in `go test -bench`, never asserted by a
// unit test.
package perf
