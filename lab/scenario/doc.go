// Package scenario runs named fault scenarios on real processes (Run,
// Names): a relay killed between publish and commit, a frozen relay
// holding a batch, Postgres and Redis restarts, a worker killed before its
// inbox commit, and the ways Redis can lose what the relay handed it
// (FLUSHALL, a deleted stream entry, a failover to a replica that never
// had the jobs, with Sentinel or in a Redis Cluster) which only the
// sender's re-drive heals, and a Redis Cluster's slots moving under load.
// Each ends by
// checking the invariants: nothing lost, nothing shown twice, order kept,
// nothing left unsent (probe.Figures.CheckInvariants).
package scenario
