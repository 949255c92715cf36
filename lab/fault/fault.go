package fault

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// Kind is what a Fault does to the environment.
type Kind string

// The fault kinds. Healing reverts each: a process killed or stopped by
// SIGTERM starts again, a frozen one continues, a server starts again, a
// toxic is removed.
const (
	Kill              Kind = "sigkill"            // SIGKILL a service process
	Stop              Kind = "sigstop"            // freeze a service process (SIGSTOP)
	Term              Kind = "sigterm"            // stop a service process gracefully (SIGTERM)
	CrashPoint        Kind = "crash-point"        // restart a service process with --fault Crash:SEQ: it SIGKILLs itself there
	RedisKill         Kind = "redis-kill"         // SIGKILL Redis
	RedisStop         Kind = "redis-stop"         // shut Redis down gracefully
	NATSKill          Kind = "nats-kill"          // SIGKILL the nats-server (env.Options.Broker "nats")
	NATSStop          Kind = "nats-stop"          // shut the nats-server down gracefully (SIGTERM)
	PostgresImmediate Kind = "postgres-immediate" // stop Postgres in immediate mode (a crash)
	PostgresFast      Kind = "postgres-fast"      // stop Postgres in fast mode
	Net               Kind = "net"                // a toxic (Fault.Net) on one service's link to Postgres or Redis
	PruneHistory      Kind = "prune-history"      // delete Target service's history older than PruneOlderThan, again and again, as retention would
	// Redis Cluster kinds (env.Options.RedisCluster); Target is the
	// service whose outbound queue's slot they act on.
	ClusterFailover Kind = "cluster-failover" // kill the queue's master once its replica is in sync; the replica is promoted; heal: the old master rejoins as a replica
	ClusterReshard  Kind = "cluster-reshard"  // move the queue's slot to another master key by key, under load
	ClusterPause    Kind = "cluster-pause"    // freeze (SIGSTOP) the queue's master; heal continues it
)

// Network fault kinds (Fault.Net), each a toxiproxy toxic or, for
// black-hole, a toxic used so.
const (
	NetLatency   = "latency"    // every chunk delayed by latency ± jitter ms
	NetTimeout   = "timeout"    // data dropped, the connection closed after timeout ms
	NetReset     = "reset_peer" // connections reset (RST) after timeout ms
	NetBandwidth = "bandwidth"  // throughput capped at rate KB/s
	NetBlackHole = "black-hole" // data dropped, the connection never closed
)

// NetKinds lists the network fault kinds in the order schedules draw them.
var NetKinds = []string{NetLatency, NetTimeout, NetReset, NetBandwidth, NetBlackHole}

// PruneOlderThan is what PruneHistory deletes: history older than this
// (prune.Run's OlderThan). Short, so that a schedule's own messages go.
const PruneOlderThan = 500 * time.Millisecond

// Servers a fault can take down (Fault.Server).
const (
	ServerRedis    = "redis"
	ServerPostgres = "postgres"
	ServerNATS     = "nats"
)

// Fault is one fault: at At (from a run's start), for For.
type Fault struct {
	At, For time.Duration
	Kind    Kind
	// Target is a process name (process kinds), a link
	// "service>postgres|redis" (Net) or a service (PruneHistory, the
	// cluster kinds); unused for the other server kinds.
	Target string
	// Net is the network kind (Net), Stream its direction ("upstream":
	// service to server; "downstream": back), Attrs its toxiproxy
	// attributes (ms or KB/s).
	Net    string
	Stream string
	Attrs  map[string]int
	// Crash is the crash point of CrashPoint (WorkerAfterCommit, …).
	Crash string
}

// Server returns the server the fault takes down (ServerRedis,
// ServerPostgres, ServerNATS), "" for the kinds that act on a process or a link.
func (f Fault) Server() string {
	switch f.Kind {
	case RedisKill, RedisStop, ClusterFailover, ClusterReshard, ClusterPause:
		return ServerRedis
	case PostgresImmediate, PostgresFast:
		return ServerPostgres
	case NATSKill, NATSStop:
		return ServerNATS
	}
	return ""
}

// Subject returns what the fault acts on: its server, else its Target.
// Faults on one subject are applied one at a time.
func (f Fault) Subject() string {
	if s := f.Server(); s != "" {
		return s
	}
	return f.Target
}

// Label describes the fault without its timing ("sigkill workers-relay",
// "latency consumers>redis upstream(jitter=3,latency=40)").
func (f Fault) Label() string {
	switch f.Kind {
	case Net:
		var a []string
		for _, k := range slices.Sorted(maps.Keys(f.Attrs)) {
			a = append(a, fmt.Sprintf("%s=%d", k, f.Attrs[k]))
		}
		return fmt.Sprintf("%s %s %s(%s)", f.Net, f.Target, f.Stream, strings.Join(a, ","))
	case CrashPoint:
		return fmt.Sprintf("%s %s", f.Crash, f.Target)
	case RedisKill, RedisStop, PostgresImmediate, PostgresFast, NATSKill, NATSStop:
		return string(f.Kind)
	}
	return string(f.Kind) + " " + f.Target
}

// String is Label with the timing: "sigkill workers-relay @5.7s+1.1s" (at
// 5.7 s, for 1.1 s).
func (f Fault) String() string {
	return fmt.Sprintf("%s @%.1fs+%.1fs", f.Label(), f.At.Seconds(), f.For.Seconds())
}

// Family is the fault's name for counting: the network kind ("net-latency")
// for Net, the crash point for CrashPoint, else the Kind.
func (f Fault) Family() string {
	switch f.Kind {
	case Net:
		return "net-" + f.Net
	case CrashPoint:
		return f.Crash
	}
	return string(f.Kind)
}

// Spec returns the --fault value that crashes a process at crash point
// crash when the message with seq passes it ("KIND:SEQ", ParseCrash's
// input).
func Spec(crash string, seq int64) string { return fmt.Sprintf("%s:%d", crash, seq) }
