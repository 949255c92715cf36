// Package latency measures the write-up's latency table per variant on real
// processes (Measure: send call → frame at a WebSocket client of the other
// service), with the round trips that bound it from below (Floors) and a
// CDF plot (WritePlot).
//
// Performance is measured here, never asserted by a unit test.
package latency
