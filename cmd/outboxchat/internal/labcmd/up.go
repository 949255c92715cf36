package labcmd

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/cmd/outboxchat/internal/cliflag"
	"github.com/outboxchat/outboxchat/lab/env"
)

// Up runs `lab up`: a private environment until ctx ends (Ctrl-C).
func Up(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("lab up", flag.ContinueOnError)
	fs.SetOutput(stderr)
	variant := fs.String("variant", env.VariantV2, "v1, v2, v2-poll or v2-intx")
	consAddr := fs.String("consumers-addr", "", "consumers' HTTP address: PORT, :PORT or 127.0.0.1:PORT (default: a free port, new each run)")
	workAddr := fs.String("workers-addr", "", "workers' HTTP address: PORT, :PORT or 127.0.0.1:PORT (default: a free port, new each run)")
	keepLogs := fs.Bool("keep-logs", false, "keep the services' logs (a temp dir, printed) after the lab stops, less the lab's secrets (token secret, event keys, TLS key), which are removed; by default the whole dir is removed")
	useTLS := fs.Bool("tls", false, "everything over TLS with a private CA made for this run (printed as \"ca: PATH\"): HTTPS and WSS to the services, sslmode=verify-full to Postgres, rediss:// to Redis")
	instances := fs.Int("instances", 1, "API+worker processes per service, each on its own port and printed as its own consumers: and workers: line (behind one load balancer they are one service)")
	cluster := fs.Bool("redis-cluster", false, "Redis as a private Redis Cluster of 3 masters and 3 replicas (the services get its redis+cluster:// URL; \"redis:\" then prints a node's URL, \"redis cluster:\" the cluster's)")
	durable := fs.Bool("durable", false, "servers as production runs them: Postgres fsync=on and synchronous_commit=on, Redis appendonly yes with appendfsync everysec (default: the fast mode, Postgres fsync=off)")
	partitions := fs.Int("partitions", 1, "partitions per direction of both services (serve --partitions): an outbox table, relay, stream and consumer each")
	broker := brokerFlag(fs)
	if err := cliflag.Parse(fs, args); err != nil {
		return err
	}
	if chat.CheckPartitions(*partitions) != nil {
		return cliflag.Usagef(fs, "lab up: --partitions %d: want 1 to %d", *partitions, chat.MaxPartitions)
	}
	if *instances < 1 {
		return cliflag.Usagef(fs, "lab up: --instances %d: want 1 or more", *instances)
	}
	if *cluster && *useTLS {
		return cliflag.Usagef(fs, "lab up: --redis-cluster with --tls is not supported")
	}
	opts := env.Options{Variant: *variant, Progress: stderr, TLS: *useTLS, Durable: *durable, APIs: *instances, Partitions: *partitions, RedisCluster: *cluster, Broker: *broker}
	var err error
	if opts.ConsumersAddr, err = loopbackAddr("--consumers-addr", *consAddr); err != nil {
		return err
	}
	if opts.WorkersAddr, err = loopbackAddr("--workers-addr", *workAddr); err != nil {
		return err
	}
	if opts.ConsumersAddr != "" && opts.ConsumersAddr == opts.WorkersAddr {
		return fmt.Errorf("lab up: --consumers-addr and --workers-addr are both %s", opts.ConsumersAddr)
	}
	if *keepLogs {
		// Not under the "outboxchat-lab-" prefix, whose dirs a later run
		// reaps once their owner is gone.
		if opts.Dir, err = os.MkdirTemp("", "outboxchat-logs-"); err != nil {
			return fmt.Errorf("lab up: logs dir: %w", err)
		}
	}
	e, err := env.Start(ctx, opts)
	if err != nil {
		return err
	}
	defer e.Close()
	fmt.Fprintf(stdout, "consumers: %s\n", e.ConsumersURL)
	for _, p := range e.ConsumersAPIs {
		fmt.Fprintf(stdout, "consumers: %s\n", p.URL())
	}
	fmt.Fprintf(stdout, "workers: %s\n", e.WorkersURL)
	for _, p := range e.WorkersAPIs {
		fmt.Fprintf(stdout, "workers: %s\n", p.URL())
	}
	fmt.Fprintf(stdout, "database: %s\n", e.DatabaseURL)
	if e.RedisCluster != nil {
		fmt.Fprintf(stdout, "redis: %s\n", e.Redis.URL())
		fmt.Fprintf(stdout, "redis cluster: %s\n", e.RedisURL)
	} else {
		fmt.Fprintf(stdout, "redis: %s\n", e.RedisURL)
	}
	if e.Broker == env.BrokerNATS {
		fmt.Fprintf(stdout, "nats: %s\n", e.NATSURL())
	}
	// Each page as a user of its own (env.PageUsers), so that it shows
	// who wrote what; the pages take their token from the URL fragment,
	// which browsers never send to a server. The token line is the
	// consumers page's, a development token for every chat on both
	// services: what a curl send with it stores shows as that user's, as
	// if typed on the consumers page, not as a third user's.
	consTok, workTok := cmp.Or(e.PageTokens[chat.Consumers], e.Token), cmp.Or(e.PageTokens[chat.Workers], e.Token)
	fmt.Fprintf(stdout, "token: %s\n", consTok)
	fmt.Fprintf(stdout, "consumers page: %s/?chat_id=1#token=%s\n", e.ConsumersURL, consTok)
	fmt.Fprintf(stdout, "workers page: %s/?chat_id=1#token=%s\n", e.WorkersURL, workTok)
	if e.PageTokens != nil {
		fmt.Fprintf(stderr, "lab: the token: line is %s's, the consumers page's user (the workers page is %s's); it is good for every chat on both services\n",
			env.PageUsers[chat.Consumers], env.PageUsers[chat.Workers])
	}
	if e.CAFile != "" {
		fmt.Fprintf(stdout, "ca: %s\n", e.CAFile)
		fmt.Fprintf(stderr, "lab: TLS with a private CA: trust %s to connect (curl --cacert %s …; a browser: import it as an authority, or accept the warning); it lives as long as the lab\n", e.CAFile, e.CAFile)
	}
	if *keepLogs {
		fmt.Fprintf(stderr, "lab: logs in %s (kept after the lab stops); Ctrl-C stops everything\n", e.Dir)
	} else {
		fmt.Fprintf(stderr, "lab: logs in %s (removed when the lab stops; --keep-logs keeps them); Ctrl-C stops everything\n", e.Dir)
	}
	<-ctx.Done()
	fmt.Fprintln(stderr, "lab: stopping")
	if *keepLogs {
		fmt.Fprintf(stderr, "lab: logs kept in %s\n", e.Dir)
	}
	return nil
}

// loopbackAddr turns a --*-addr value (PORT, :PORT, 127.0.0.1:PORT,
// localhost:PORT or [::1]:PORT) into "HOST:PORT" on a loopback address ("" stays "",
// meaning a free port), and checks that the port is free now, so a taken
// port fails before anything starts. Other hosts are refused: the lab is
// for this machine only.
func loopbackAddr(flagName, v string) (string, error) {
	addr, err := parseLoopbackAddr(flagName, v)
	if err != nil || addr == "" {
		return addr, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		var opErr *net.OpError
		if errors.As(err, &opErr) {
			err = opErr.Err
		}
		return "", fmt.Errorf("lab up: %s %s: %w", flagName, addr, err)
	}
	_ = ln.Close()
	return addr, nil
}

// parseLoopbackAddr is loopbackAddr without the check that the port is free.
func parseLoopbackAddr(flagName, v string) (string, error) {
	if v == "" {
		return "", nil
	}
	host, port, err := net.SplitHostPort(v)
	if err != nil {
		host, port = "", v // a bare port
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", fmt.Errorf("lab up: %s %q: want PORT, :PORT or 127.0.0.1:PORT with a port from 1 to 65535", flagName, v)
	}
	switch host {
	case "", "localhost":
		host = "127.0.0.1"
	default:
		if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
			return "", fmt.Errorf("lab up: %s %q: the lab listens on loopback addresses only (127.0.0.1, ::1)", flagName, v)
		}
	}
	return net.JoinHostPort(host, port), nil
}

// brokerFlag is the lab commands' --broker: the queue between the services.
func brokerFlag(fs *flag.FlagSet) *string {
	return fs.String("broker", env.BrokerRedis, "the queue between the services: redis (Redis Streams on the lab's Redis) or nats (JetStream on a private nats-server, serve --broker-url; Redis stays for the seq fence, presence and the live hub)")
}
