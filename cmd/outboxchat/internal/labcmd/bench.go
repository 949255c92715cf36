package labcmd

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/cmd/outboxchat/internal/cliflag"
	"github.com/outboxchat/outboxchat/lab/env"
	"github.com/outboxchat/outboxchat/lab/perf"
)

// Bench runs `lab bench`.
func Bench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("lab bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	senders := fs.Int("senders", perf.DefaultBenchSenders, "concurrent senders (closed loop, keep-alive HTTP)")
	chats := fs.Int("chats", perf.DefaultBenchChats, "chats the messages are spread over (one WebSocket watcher each)")
	messages := fs.Int("messages", perf.DefaultBenchMessages, "messages to send")
	variant := fs.String("variant", env.VariantV2, "v2, v2-intx, v2-poll or v1")
	timeout := fs.Duration("timeout", perf.DefaultBenchSendTimeout, "bound on the sending phase")
	asJSON := fs.Bool("json", false, "print one JSON object (DESIGN.md fields plus cpu_s); the details go to stderr")
	hold := fs.Bool("hold-snapshot", false, "hold a REPEATABLE READ snapshot open (idle in transaction) through the run, as a forgotten session would")
	insecure := fs.Bool("insecure", false, "services without auth and without signed stream entries (to measure what they cost)")
	retention := fs.Duration("history-retention", 0, "run the services with --history-retention D (0 = keep everything), to measure retention pruning under load")
	pgbouncer := fs.Bool("pgbouncer", false, "services reach Postgres through a private PgBouncer in transaction mode (LISTEN direct), as on a managed deployment")
	durable := fs.Bool("durable", false, "servers as production runs them: Postgres fsync=on and synchronous_commit=on, Redis appendonly yes with appendfsync everysec (default: the fast mode, Postgres fsync=off)")
	profileDir := fs.String("profile-dir", "", "write, from 2 s after the first send, a CPU profile (--profile-seconds) and allocation profiles before and after it of every service process into this directory (pprof format)")
	profileSeconds := fs.Int("profile-seconds", perf.DefaultProfileSeconds, "length of the --profile-dir CPU profile in seconds")
	redisLatency := fs.Duration("redis-latency", 0, "delay every reply from Redis to the services by this much (toxiproxy links in the lab's process), as across a network; whole milliseconds (default 0: direct)")
	partitions := fs.Int("partitions", 1, "both services' --partitions (an outbox table, relay, stream and consumer per partition)")
	counts := fs.Bool("counts", false, "count the services' Postgres statements (pg_stat_statements, preloaded) and all Redis commands (INFO commandstats) during the run, and print them per message")
	transport := fs.String("transport", perf.TransportHTTP, "how the senders send: http (a POST per message on a kept-alive connection) or ws (a WebSocket per sender, a send frame per message, waiting for its ack)")
	broker := brokerFlag(fs)
	if err := cliflag.Parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("lab bench: unexpected arguments %q", fs.Args())
	}
	if *senders <= 0 || *chats <= 0 || *messages <= 0 || *timeout <= 0 {
		return cliflag.Usagef(fs, "lab bench: --senders, --chats, --messages and --timeout must be positive")
	}
	if env.CheckVariant(*variant) != nil {
		return cliflag.Usagef(fs, "lab bench: --variant %q: want %s", *variant, env.VariantNames)
	}
	if *transport != perf.TransportHTTP && *transport != perf.TransportWS {
		return cliflag.Usagef(fs, "lab bench: --transport %q: want http or ws", *transport)
	}
	if chat.CheckPartitions(*partitions) != nil {
		return cliflag.Usagef(fs, "lab bench: --partitions %d: want 1 to %d", *partitions, chat.MaxPartitions)
	}
	res, err := perf.Bench(ctx, perf.BenchOptions{Senders: *senders, Chats: *chats, Messages: *messages,
		Variant: *variant, SendTimeout: *timeout, Progress: stderr, HoldSnapshot: *hold, Insecure: *insecure, PgBouncer: *pgbouncer, Durable: *durable, Retention: *retention,
		ProfileDir: *profileDir, ProfileSeconds: *profileSeconds, Counts: *counts, Partitions: *partitions, RedisLatency: *redisLatency, Transport: *transport, Broker: *broker})
	if err != nil {
		return err
	}
	if *asJSON {
		res.WriteText(stderr)
		if err := json.NewEncoder(stdout).Encode(res); err != nil {
			return fmt.Errorf("lab bench: write json: %w", err)
		}
		return nil
	}
	res.WriteText(stdout)
	return nil
}
