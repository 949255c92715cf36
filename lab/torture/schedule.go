package torture

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/lab/fault"
)

// schedule is everything drawn for one schedule.
type schedule struct {
	K                              int
	APIs                           int // api,worker processes per service
	ConsumersRelays, WorkersRelays int
	Chats                          int
	Senders                        int // sender goroutines per service
	Clients                        int // WebSocket clients per service
	Redrive                        bool
	Malformed                      int  // malformed entries added to each stream
	Cluster                        bool // Redis is a cluster (Options.RedisCluster)
	NATS                           bool // the queue is JetStream (Options.Broker env.BrokerNATS)
	Partitions                     int  // --partitions of every service process (Options.Partitions)
	Faults                         []fault.Fault
}

func (s *schedule) topology() string {
	rd := "re-drive on"
	if !s.Redrive {
		rd = "re-drive off"
	}
	t := fmt.Sprintf("%d api/svc, relays %d+%d, %d chats, %d senders+%d clients/svc, %s", s.APIs, s.ConsumersRelays, s.WorkersRelays, s.Chats, s.Senders, s.Clients, rd)
	if s.Malformed > 0 {
		t += fmt.Sprintf(", %d malformed/stream", s.Malformed)
	}
	if s.Cluster {
		t += ", redis cluster 3+3, replica acks 1"
	}
	if s.NATS {
		t += ", queue on nats"
	}
	if s.Partitions > 1 {
		t += fmt.Sprintf(", %d partitions", s.Partitions)
	}
	return t
}

// procNames returns the schedule's service processes by role: those that
// run a worker (api,worker[,relay]) and those that run a relay.
func (s *schedule) procNames() (workers, relays []string) {
	for _, svc := range []string{chat.Consumers, chat.Workers} {
		for i := 1; i <= s.APIs; i++ {
			name := svc
			if i > 1 {
				name += "-" + strconv.Itoa(i)
			}
			workers = append(workers, name)
		}
		n := s.ConsumersRelays
		if svc == chat.Workers {
			n = s.WorkersRelays
		}
		if n == 0 {
			for i := 1; i <= s.APIs; i++ {
				name := svc
				if i > 1 {
					name += "-" + strconv.Itoa(i)
				}
				relays = append(relays, name)
			}
		}
		for i := 1; i <= n; i++ {
			name := svc + "-relay"
			if i > 1 {
				name += "-" + strconv.Itoa(i)
			}
			relays = append(relays, name)
		}
	}
	return workers, relays
}

// drawSchedule draws schedule k of seed: the same (seed, k) always gives
// the same schedule.
func drawSchedule(seed uint64, k int, d time.Duration) *schedule {
	return draw(seed, k, d, false, false)
}

// draw is drawSchedule, on a Redis Cluster when cluster is set: then
// about a third of the faults are cluster faults, and no single-server
// Redis fault nor toxic on a Redis link is drawn (the rest of the draw is
// the same as without). With nats (the queue on JetStream) each Redis
// server fault drawn becomes, on a coin toss, the same fault on the
// nats-server (fault.NATSKill, fault.NATSStop).
func draw(seed uint64, k int, d time.Duration, cluster, nats bool) *schedule {
	r := rand.New(rand.NewPCG(seed, uint64(k)))
	s := &schedule{K: k, Cluster: cluster, NATS: nats}
	switch r.IntN(3) {
	case 0: // every role in one process per service
		s.APIs = 1
	case 1: // a separate relay
		s.APIs, s.ConsumersRelays, s.WorkersRelays = 1, 1, 1
	default: // two API processes (each with a worker) and two relays per service
		s.APIs, s.ConsumersRelays, s.WorkersRelays = 2, 2, 2
	}
	s.Chats = 3 + r.IntN(6)
	s.Senders = 1 + r.IntN(2)
	s.Clients = 2 + r.IntN(3)
	s.Redrive = r.IntN(2) == 0
	if r.IntN(4) == 0 {
		s.Malformed = 1 + r.IntN(2)
	}
	workers, relays := s.procNames()
	all := slices.Compact(slices.Sorted(slices.Values(append(append([]string(nil), workers...), relays...))))
	links := []string{}
	for _, svc := range []string{chat.Consumers, chat.Workers} {
		links = append(links, svc+">postgres")
		if !cluster {
			links = append(links, svc+">redis")
		}
	}
	n := 2 + r.IntN(4)
	ms := func(lo, hi int) time.Duration { return time.Duration(lo+r.IntN(hi-lo+1)) * time.Millisecond }
	for range n {
		f := fault.Fault{At: time.Duration(r.Int64N(int64(d * 3 / 4)))}
		c := r.IntN(100)
		if cluster && (r.IntN(3) == 0 || (c >= 52 && c < 64)) {
			// A cluster fault, also in place of a single-server one.
			f.Target = []string{chat.Consumers, chat.Workers}[r.IntN(2)]
			switch r.IntN(3) {
			case 0:
				f.Kind, f.For = fault.ClusterFailover, ms(500, 2500)
			case 1:
				f.Kind = fault.ClusterReshard
			default:
				f.Kind, f.For = fault.ClusterPause, ms(200, 2500)
			}
			s.Faults = append(s.Faults, f)
			continue
		}
		switch {
		case c < 15:
			f.Kind, f.Target, f.For = fault.Kill, all[r.IntN(len(all))], ms(100, 1500)
		case c < 27:
			f.Kind, f.Target, f.For = fault.Stop, all[r.IntN(len(all))], ms(300, 4000)
		case c < 37:
			f.Kind, f.Target, f.For = fault.Term, all[r.IntN(len(all))], ms(100, 1500)
		case c < 52:
			f.Kind, f.For = fault.CrashPoint, 6*time.Second
			switch r.IntN(3) {
			case 0:
				f.Crash, f.Target = fault.RelayAfterPublish, relays[r.IntN(len(relays))]
			case 1:
				f.Crash, f.Target = fault.WorkerBeforeCommit, workers[r.IntN(len(workers))]
			default:
				f.Crash, f.Target = fault.WorkerAfterCommit, workers[r.IntN(len(workers))]
			}
		case c < 59:
			f.Kind, f.For = fault.RedisKill, ms(200, 2500)
			if nats && r.IntN(2) == 0 {
				f.Kind = fault.NATSKill
			}
		case c < 64:
			f.Kind, f.For = fault.RedisStop, ms(200, 2500)
			if nats && r.IntN(2) == 0 {
				f.Kind = fault.NATSStop
			}
		case c < 69:
			f.Kind, f.For = fault.PostgresImmediate, ms(200, 2500)
		case c < 74:
			f.Kind, f.For = fault.PostgresFast, ms(200, 2500)
		case c < 80:
			f.Kind, f.Target, f.For = fault.PruneHistory, []string{chat.Consumers, chat.Workers}[r.IntN(2)], ms(500, 5000)
		default:
			f.Kind, f.Target, f.For = fault.Net, links[r.IntN(len(links))], ms(500, 5000)
			f.Net = fault.NetKinds[r.IntN(len(fault.NetKinds))]
			f.Stream = []string{"upstream", "downstream"}[r.IntN(2)]
			switch f.Net {
			case fault.NetLatency:
				f.Attrs = map[string]int{"latency": 20 + r.IntN(480), "jitter": r.IntN(50)}
			case fault.NetTimeout:
				f.Attrs = map[string]int{"timeout": 200 + r.IntN(2000)}
			case fault.NetReset:
				f.Attrs = map[string]int{"timeout": r.IntN(500)}
			case fault.NetBandwidth:
				f.Attrs = map[string]int{"rate": 4 + r.IntN(60)}
			case fault.NetBlackHole:
				f.Attrs = map[string]int{}
			}
		}
		s.Faults = append(s.Faults, f)
	}
	sort.SliceStable(s.Faults, func(i, j int) bool { return s.Faults[i].At < s.Faults[j].At })
	return s
}
