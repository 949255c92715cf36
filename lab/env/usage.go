package env

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/lab/process"
	"github.com/outboxchat/outboxchat/natsq"
)

// RedisUsedMB returns the lab Redis's used_memory in MB (2^20 bytes).
func (env *Env) RedisUsedMB(ctx context.Context) (float64, error) {
	info, err := env.RedisClient().Info(ctx, "memory").Result()
	if err != nil {
		return 0, fmt.Errorf("lab: redis info: %w", err)
	}
	v, ok := infoField(info, "used_memory")
	if !ok {
		return 0, errors.New("lab: redis info: no used_memory")
	}
	b, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return 0, fmt.Errorf("lab: redis info: used_memory %q: %w", v, err)
	}
	return math.Round(b/(1<<20)*100) / 100, nil
}

// infoField returns field key of a Redis INFO reply.
func infoField(info, key string) (string, bool) {
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), key+":"); ok {
			return v, true
		}
	}
	return "", false
}

// CPU returns the CPU seconds used so far by each service process (by
// name),
// by Postgres (postmaster, live children, and reaped children through the
// postmaster's cutime/cstime), by redis-server and by the nats-server of
// Options.Broker BrokerNATS ("nats", every node's with NATSCluster).
func (env *Env) CPU(ctx context.Context) (map[string]float64, error) {
	out := map[string]float64{}
	for _, p := range env.Procs() {
		u, err := p.Usage()
		if err != nil {
			return nil, err
		}
		out[p.Name()] = u.CPUSeconds
	}
	if pid, err := postmasterPID(env); err == nil {
		out["postgres"] = process.TreeCPU(pid)
	}
	if info, err := env.RedisClient().Info(ctx, "server").Result(); err == nil {
		if v, ok := infoField(info, "process_id"); ok {
			if pid, err := strconv.Atoi(v); err == nil {
				out["redis"] = process.TreeCPU(pid)
			}
		}
	}
	for _, s := range env.natsServers() {
		if pid := s.PID(); pid > 0 {
			out["nats"] += process.TreeCPU(pid)
		}
	}
	return out, nil
}

// postmasterPID reads the first line of the data directory's postmaster.pid.
func postmasterPID(env *Env) (int, error) {
	b, err := os.ReadFile(filepath.Join(env.Postgres.Dir(), "data", "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strconv.Atoi(strings.TrimSpace(line))
}

// NATSPending returns how many events of partition p's queue from service
// from the consumer group of service group has not acknowledged, delivered
// or not yet (JetStream's NumAckPending + NumPending), with
// Options.Broker BrokerNATS: 0 when the stream or the consumer does not
// exist yet. Without NATS it is an error.
func (env *Env) NATSPending(ctx context.Context, from, group string, p int) (int64, error) {
	if env.Broker != BrokerNATS {
		return 0, errors.New("lab: no nats-server in this lab")
	}
	nc, err := env.natsConn()
	if err != nil {
		return 0, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, fmt.Errorf("lab: %w", err)
	}
	stream, _, _ := NATSStreams(from, p)
	c, err := js.Consumer(ctx, stream, chat.NATSName(group))
	if errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrConsumerNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("lab: nats consumer %s on %s: %w", group, stream, err)
	}
	info := c.CachedInfo()
	return int64(info.NumAckPending) + int64(info.NumPending), nil
}

// NATSStreams returns the JetStream names of partition p's queue from
// service from as the lab's services make them (natsq.Names with the
// services' prefix): the stream, its dead-letter stream and the subject
// events are published on.
func NATSStreams(from string, p int) (stream, dead, subject string) {
	return natsq.Names(chat.NATSName(RedisPrefix), chat.NATSName(chat.PartitionQueue(from, p)))
}
