package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/chat/status"
	"github.com/outboxchat/outboxchat/cmd/outboxchat/internal/cliflag"
	"github.com/outboxchat/outboxchat/natsq"
)

// errNeedsPerson is status's error when something needs a person (exit 1),
// wrapped with where the report lists it.
var errNeedsPerson = errors.New("status: something needs a person")

// runStatus prints both services on one screen and returns errNeedsPerson
// when Status.Problems is not empty, pointing at the report's list: the
// text's NEEDS A PERSON, the JSON's "problems".
func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := newOpsFlags(fs, true, true)
	backlog := fs.Duration("max-backlog-age", status.DefaultMaxBacklogAge, "a problem when the oldest unsent outbox row is older than this")
	xact := fs.Duration("max-transaction-age", status.DefaultMaxTransactionAge, "a problem when a transaction or snapshot the database can see is older than this (it holds back cleanup)")
	brokerURL := cliflag.EnvString(fs, "broker-url", "BROKER_URL", "the queue on NATS JetStream, as given to serve: its figures are read there (default $BROKER_URL, else \"\": Redis Streams on --redis-url)")
	if err := cliflag.Parse(fs, args); err != nil {
		return err
	}
	pool, err := f.pool(ctx, "status")
	if err != nil {
		return err
	}
	defer pool.Close()
	var rdb redis.UniversalClient
	if *f.redisURL != "" {
		c, err := f.redis("status")
		if err != nil {
			return err
		}
		defer c.Close()
		rdb = c
	}
	var nc *nats.Conn
	if *brokerURL != "" {
		if nc, err = natsq.Connect(*brokerURL, nats.Name("outboxchat-status"), nats.MaxReconnects(0)); err != nil {
			return fmt.Errorf("status: %w", err)
		}
		defer nc.Close()
	}
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := status.ReadStatus(qctx, pool, rdb, nc, *f.prefix, status.StatusThresholds{BacklogAge: *backlog, TransactionAge: *xact},
		f.commandFlags(fs))
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	if *f.asJSON {
		if err := printJSON(stdout, st); err != nil {
			return err
		}
	} else {
		writeStatus(stdout, st)
	}
	if !st.Healthy {
		if *f.asJSON {
			return fmt.Errorf(`%w: see "problems" in the report`, errNeedsPerson)
		}
		return fmt.Errorf("%w: see NEEDS A PERSON in the report", errNeedsPerson)
	}
	return nil
}

func secs(v float64) string {
	switch {
	case v < 10:
		return fmt.Sprintf("%.1fs", v)
	case v < 3600:
		return fmt.Sprintf("%.0fs", v)
	}
	return (time.Duration(v) * time.Second).String()
}

// drained is s's "drained:" value: true, false, or, when status could not
// read some of its figures, "unknown (Redis not read)" and the like.
func drained(s *status.ServiceStatus) string {
	notRead := s.NotRead()
	if s.Drained || len(notRead) == 0 {
		return strconv.FormatBool(s.Drained)
	}
	names := map[string]string{"database": "database", "redis": "Redis", "nats": "NATS"}
	for i, n := range notRead {
		if names[n] != "" {
			notRead[i] = names[n]
		}
	}
	return "unknown (" + strings.Join(notRead, " and ") + " not read)"
}

// queueRead reports whether status read s's queue figures (stream length,
// pending, lag, dead letters): from Redis, or NATS with --broker-url.
func queueRead(s *status.ServiceStatus) bool {
	notRead := s.NotRead()
	return !slices.Contains(notRead, "redis") && !slices.Contains(notRead, "nats")
}

// figure is n, or "-" when it was not read (ok false): not read is not 0.
func figure(n int64, ok bool) string {
	if !ok {
		return "-"
	}
	return strconv.FormatInt(n, 10)
}

func writeStatus(w io.Writer, st *status.Status) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "service\tunsent\toldest unsent\tparked\tlast relay pass\tstream read\tlength\tpending\tlag\tdead letters")
	for _, s := range st.Services {
		pass := "never"
		if s.LastRelayPassSeconds != nil {
			pass = secs(*s.LastRelayPassSeconds) + " ago"
		}
		// With partitions the figures are the sums over every partition's
		// stream; the name is partition 0's, and says there are more.
		stream := s.Stream
		if n := len(s.Partitions); n > 1 {
			stream = fmt.Sprintf("%s (+%d partitions)", stream, n-1)
		}
		q := queueRead(&s)
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Service, s.Unsent, secs(s.OldestUnsentSeconds), s.Parked,
			pass, stream, figure(s.StreamLength, q), figure(s.StreamPending, q), figure(s.StreamLag, q), figure(s.DeadLetters, q))
	}
	tw.Flush()
	for _, s := range st.Services {
		if len(s.Partitions) > 1 {
			for _, p := range s.Partitions {
				owner := p.LeaseOwner
				if owner == "" {
					owner = "NO LIVE LEASE"
				}
				q := queueRead(&s)
				fmt.Fprintf(w, "%s partition %d: unsent %d (oldest %s), stream %s pending %s lag %s, relay %s\n",
					s.Service, p.Partition, p.Unsent, secs(p.OldestUnsentSeconds), p.Stream, figure(p.StreamPending, q), figure(p.StreamLag, q), owner)
			}
		}
		fmt.Fprintf(w, "%s drained: %s\n", s.Service, drained(&s))
	}
	for _, s := range st.Services {
		for _, r := range s.Relays {
			// Say how the relay learns of new rows: a relay on its poll
			// alone delivers up to one poll interval late.
			listening := "poll only (--poll-only)"
			if r.Listening != nil {
				listening = map[bool]string{
					true:  "listening (woken by NOTIFY)",
					false: "NOT LISTENING: on the poll alone until its LISTEN connection is back",
				}[*r.Listening]
			}
			fmt.Fprintf(w, "%s relay %s: last pass %s ago, %s\n", s.Service, r.Name, secs(r.LastPassSeconds), listening)
		}
		for _, c := range s.Consumers {
			fmt.Fprintf(w, "%s consumer %s: pending %d, idle %s, live processes %d\n", s.Service, c.Name, c.Pending, secs(c.IdleSeconds), c.Processes)
		}
	}
	for _, n := range st.Redis {
		switch {
		case n.Durable == nil:
			fmt.Fprintf(w, "redis %s: durability unknown (%s)\n", n.Addr, n.Error)
		default:
			d := map[bool]string{true: "durable", false: "NOT DURABLE"}[*n.Durable]
			fmt.Fprintf(w, "redis %s: appendonly %s, maxmemory-policy %s: %s\n", n.Addr, n.AppendOnly, n.MaxMemoryPolicy, d)
		}
	}
	if st.Database.Error == "" {
		fmt.Fprintf(w, "database: oldest transaction %s, oldest xmin %.0f xids old\n",
			secs(st.Database.OldestTransactionSeconds), st.Database.OldestXminAgeXids)
	}
	if st.Healthy {
		fmt.Fprintln(w, "healthy")
		return
	}
	fmt.Fprintf(w, "NEEDS A PERSON (%d):\n", len(st.Problems))
	for _, p := range st.Problems {
		fmt.Fprintln(w, "  - "+p)
	}
}
