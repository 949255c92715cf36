package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/outbox"
	"github.com/outboxchat/outboxchat/redisq"
)

// errNeedsPerson is status's error when something needs a person (exit 1).
var errNeedsPerson = errors.New("status: something needs a person (see problems)")

// opsFlags are the connection and output flags the operator commands share.
type opsFlags struct {
	dbURL, redisURL, prefix *string
	asJSON                  *bool
}

func newOpsFlags(fs *flag.FlagSet, db, rds bool) opsFlags {
	var f opsFlags
	if db {
		f.dbURL = fs.String("database-url", os.Getenv("DATABASE_URL"), "Postgres URL (default $DATABASE_URL): a role that can read the service schemas, e.g. the database owner")
	}
	if rds {
		f.redisURL = fs.String("redis-url", os.Getenv("REDIS_URL"), "Redis URL (default $REDIS_URL)")
		f.prefix = fs.String("redis-prefix", chat.DefaultRedisPrefix, "prefix of every Redis key (as given to serve)")
	}
	f.asJSON = fs.Bool("json", false, "print JSON instead of text")
	return f
}

func (f opsFlags) pool(ctx context.Context, cmd string) (*pgxpool.Pool, error) {
	if *f.dbURL == "" {
		return nil, fmt.Errorf("%s: no database URL (--database-url or DATABASE_URL)", cmd)
	}
	p, err := pgxpool.New(ctx, *f.dbURL)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cmd, err)
	}
	return p, nil
}

func (f opsFlags) redis(cmd string) (*redis.Client, error) {
	if *f.redisURL == "" {
		return nil, fmt.Errorf("%s: no redis URL (--redis-url or REDIS_URL)", cmd)
	}
	r, err := redisq.NewClient(*f.redisURL)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cmd, err)
	}
	return r, nil
}

func printJSON(w io.Writer, v any) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(v)
}

// status prints both services on one screen and returns errNeedsPerson
// when Status.Problems is not empty.
func status(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := newOpsFlags(fs, true, true)
	backlog := fs.Duration("max-backlog-age", chat.DefaultMaxBacklogAge, "a problem when the oldest unsent outbox row is older than this")
	xact := fs.Duration("max-transaction-age", chat.DefaultMaxTransactionAge, "a problem when a transaction or snapshot the database can see is older than this (it holds back cleanup)")
	if err := fs.Parse(args); err != nil {
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
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := chat.ReadStatus(qctx, pool, rdb, *f.prefix, chat.StatusThresholds{BacklogAge: *backlog, TransactionAge: *xact})
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
		return errNeedsPerson
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

func writeStatus(w io.Writer, st *chat.Status) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "service\tunsent\toldest unsent\tparked\tlast relay pass\tstream read\tlength\tpending\tlag\tdead letters")
	for _, s := range st.Services {
		pass := "never"
		if s.LastRelayPassSeconds != nil {
			pass = secs(*s.LastRelayPassSeconds) + " ago"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\t%s\t%d\t%d\t%d\t%d\n", s.Service, s.Unsent, secs(s.OldestUnsentSeconds), s.Parked,
			pass, s.Stream, s.StreamLength, s.StreamPending, s.StreamLag, s.DeadLetters)
	}
	tw.Flush()
	for _, s := range st.Services {
		for _, c := range s.Consumers {
			fmt.Fprintf(w, "%s consumer %s: pending %d, idle %s\n", s.Service, c.Name, c.Pending, secs(c.IdleSeconds))
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

const deadlettersUsage = `usage: outboxchat deadletters <action> [flags] [ID ...]

actions (the dead letters of the stream SERVICE reads, i.e. its worker's):
  list    [--service S] [--after ID] [--count N]   oldest first; both services without --service
  show    --service S ID ...                        every field of the entries
  replay  --service S (ID ... | --all)              back on the stream, signature kept; a repeat is a no-op
  drop    --service S (ID ... | --all)              delete; a repeat is a no-op
flags: --redis-url URL, --redis-prefix P, --json
`

// deadLetterView is one dead letter as printed.
type deadLetterView struct {
	Service  string          `json:"service"`
	DeadID   string          `json:"dead_id"`
	At       time.Time       `json:"at"`
	ID       string          `json:"id"`
	Name     string          `json:"name"`
	Reason   string          `json:"reason"`
	StreamID string          `json:"stream_id"`
	Signed   bool            `json:"signed"`
	Payload  json.RawMessage `json:"payload,omitempty"`
}

func viewDeadLetter(svc string, d redisq.DeadLetter, withPayload bool) deadLetterView {
	v := deadLetterView{Service: svc, DeadID: d.DeadID, At: d.At.UTC(), ID: d.ID, Name: d.Name, Reason: d.Reason,
		StreamID: d.StreamID, Signed: d.Sig != ""}
	if withPayload {
		if json.Valid(d.Payload) {
			v.Payload = d.Payload
		} else {
			v.Payload, _ = json.Marshal(string(d.Payload))
		}
	}
	return v
}

func deadletters(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	action, fs, err := parseAction("deadletters", deadlettersUsage, []string{"list", "show", "replay", "drop"}, args, stderr)
	if err != nil {
		return err
	}
	f := newOpsFlags(fs, false, true)
	svc := fs.String("service", "", "the service whose worker dead-lettered the entries (it reads the other's stream)")
	after := fs.String("after", "", "list: start after this dead-letter id")
	count := fs.Int("count", 100, "list: at most this many per service")
	all := fs.Bool("all", false, "replay, drop: every entry")
	logFormat := fs.String("log-format", "text", "log format (stderr): text or json")
	ids, err := parseInterleaved(fs, args[1:])
	if err != nil {
		return err
	}
	services := []string{chat.Consumers, chat.Workers}
	if *svc != "" {
		if chat.Peer(*svc) == "" {
			return fmt.Errorf("deadletters: --service %q: want consumers or workers", *svc)
		}
		services = []string{*svc}
	} else if action != "list" {
		return fmt.Errorf("deadletters %s: --service is required", action)
	}
	if (action == "replay" || action == "drop") && (len(ids) == 0) == !*all {
		return fmt.Errorf("deadletters %s: give entry ids or --all (not both)", action)
	}
	if action == "show" && len(ids) == 0 {
		return errors.New("deadletters show: give entry ids")
	}
	rdb, err := f.redis("deadletters")
	if err != nil {
		return err
	}
	defer rdb.Close()
	log := newLogger(stderr, *logFormat).With("command", "deadletters "+action)
	tools := map[string]*redisq.DeadLetters{}
	for _, s := range services {
		if tools[s], err = redisq.NewDeadLetters(rdb, *f.prefix, chat.QueueName(chat.Peer(s)), 0, log); err != nil {
			return err
		}
	}
	switch action {
	case "list":
		out := []deadLetterView{}
		for _, s := range services {
			ds, err := tools[s].List(ctx, *after, *count)
			if err != nil {
				return err
			}
			for _, d := range ds {
				out = append(out, viewDeadLetter(s, d, false))
			}
		}
		if *f.asJSON {
			return printJSON(stdout, out)
		}
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "service\tdead id\tat\tmessage id\treason")
		for _, v := range out {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", v.Service, v.DeadID, v.At.Format(time.RFC3339), v.ID, v.Reason)
		}
		return tw.Flush()
	case "show":
		out := []deadLetterView{}
		for _, id := range ids {
			d, ok, err := tools[*svc].Get(ctx, id)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("deadletters show: no dead letter %s on %s", id, chat.QueueName(chat.Peer(*svc)))
			}
			out = append(out, viewDeadLetter(*svc, d, true))
		}
		if *f.asJSON {
			return printJSON(stdout, out)
		}
		for _, v := range out {
			fmt.Fprintf(stdout, "dead id:   %s\nat:        %s\nmessage:   %s (%s)\nreason:    %s\nstream id: %s\nsigned:    %t\npayload:   %s\n\n",
				v.DeadID, v.At.Format(time.RFC3339Nano), v.ID, v.Name, v.Reason, v.StreamID, v.Signed, v.Payload)
		}
		return nil
	}
	if *all {
		// Every entry, page by page (replay and drop remove them, so each
		// page starts after the last id seen).
		ids = nil
		last := ""
		for {
			ds, err := tools[*svc].List(ctx, last, 1000)
			if err != nil {
				return err
			}
			if len(ds) == 0 {
				break
			}
			for _, d := range ds {
				ids = append(ids, d.DeadID)
			}
			last = ds[len(ds)-1].DeadID
		}
	}
	type result struct {
		DeadID string `json:"dead_id"`
		// Done: replayed (StreamID is the new entry) or dropped now; false
		// when the entry was not there (done before).
		Done     bool   `json:"done"`
		StreamID string `json:"stream_id,omitempty"`
	}
	res := []result{}
	if action == "replay" {
		nids, err := tools[*svc].Replay(ctx, ids...)
		for i, n := range nids {
			res = append(res, result{DeadID: ids[i], Done: n != "", StreamID: n})
		}
		if err != nil {
			return err
		}
	} else {
		for _, id := range ids {
			n, err := tools[*svc].Drop(ctx, id)
			if err != nil {
				return err
			}
			res = append(res, result{DeadID: id, Done: n == 1})
		}
	}
	if *f.asJSON {
		return printJSON(stdout, res)
	}
	done := 0
	for _, r := range res {
		if r.Done {
			done++
		}
	}
	verb := map[string]string{"replay": "replayed", "drop": "dropped"}[action]
	fmt.Fprintf(stdout, "%s %d of %d (the others were gone already)\n", verb, done, len(res))
	return nil
}

const outboxUsage = `usage: outboxchat outbox <action> --service S [flags]

actions:
  parked  [--limit N]              the parked rows (publish failed --relay-max-attempts times)
  retry   (--id N[,N...] | --all)  put parked rows back in line (new row ids); a repeat is a no-op
flags: --database-url URL, --json
`

func outboxCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	action, fs, err := parseAction("outbox", outboxUsage, []string{"parked", "retry"}, args, stderr)
	if err != nil {
		return err
	}
	f := newOpsFlags(fs, true, false)
	svc := fs.String("service", "", "consumers or workers (required)")
	limit := fs.Int("limit", 100, "parked: at most this many rows (0 = all)")
	idList := fs.String("id", "", "retry: comma-separated row ids")
	all := fs.Bool("all", false, "retry: every parked row")
	logFormat := fs.String("log-format", "text", "log format (stderr): text or json")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if chat.Peer(*svc) == "" {
		return fmt.Errorf("outbox %s: --service %q: want consumers or workers", action, *svc)
	}
	var ids []int64
	if *idList != "" {
		for _, s := range strings.Split(*idList, ",") {
			n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
			if err != nil || n <= 0 {
				return fmt.Errorf("outbox retry: --id %q: want positive row ids", s)
			}
			ids = append(ids, n)
		}
	}
	if action == "retry" && (len(ids) == 0) == !*all {
		return errors.New("outbox retry: give --id or --all (not both)")
	}
	pool, err := f.pool(ctx, "outbox")
	if err != nil {
		return err
	}
	defer pool.Close()
	table := *svc + ".outbox"
	if action == "parked" {
		rows, err := outbox.Parked(ctx, pool, table, *limit)
		if err != nil {
			return err
		}
		type view struct {
			RowID     int64           `json:"row_id"`
			ID        string          `json:"id"`
			Event     string          `json:"event"`
			CreatedAt time.Time       `json:"created_at"`
			ParkedAt  time.Time       `json:"parked_at"`
			Attempts  int             `json:"attempts"`
			Failures  int             `json:"failures"`
			LastError string          `json:"last_error"`
			Payload   json.RawMessage `json:"payload"`
		}
		out := []view{}
		for _, r := range rows {
			out = append(out, view{r.RowID, r.ID, r.Event, r.CreatedAt.UTC(), r.ParkedAt.UTC(), r.Attempts, r.Failures, r.LastError, r.Payload})
		}
		if *f.asJSON {
			return printJSON(stdout, out)
		}
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "row id\tmessage id\tevent\tparked at\tfailures\tlast error")
		for _, v := range out {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\n", v.RowID, v.ID, v.Event, v.ParkedAt.Format(time.RFC3339), v.Failures, v.LastError)
		}
		return tw.Flush()
	}
	log := newLogger(stderr, *logFormat).With("command", "outbox retry", "service", *svc)
	re, err := outbox.Retry(ctx, pool, table, chat.OutboxChannel(*svc), ids)
	if err != nil {
		return err
	}
	for _, r := range re {
		log.Info("parked outbox row put back in line", slog.Int64("row_id", r.OldRowID), slog.Int64("new_row_id", r.NewRowID), slog.String("message_id", r.ID))
	}
	if len(re) == 0 {
		log.Info("no parked rows to retry (retried already, or none parked)", slog.Any("row_ids", ids))
	}
	if *f.asJSON {
		type view struct {
			RowID    int64  `json:"row_id"`
			NewRowID int64  `json:"new_row_id"`
			ID       string `json:"id"`
		}
		out := []view{}
		for _, r := range re {
			out = append(out, view{r.OldRowID, r.NewRowID, r.ID})
		}
		return printJSON(stdout, out)
	}
	fmt.Fprintf(stdout, "retried %d parked row(s)\n", len(re))
	return nil
}

// parseInterleaved parses args with fs, flags and positional arguments in
// any order ("replay ID --service S" as well as "replay --service S ID"),
// and returns the positional ones.
// parseAction reads the action of `outboxchat <cmd> <action> [flags]`
// (args[0], one of actions) and returns it with a FlagSet named
// "<cmd> <action>" that reports to stderr. A missing or unknown action
// prints usage and is an error.
func parseAction(cmd, usage string, actions, args []string, stderr io.Writer) (string, *flag.FlagSet, error) {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fmt.Fprint(stderr, usage)
		return "", nil, fmt.Errorf("%s: want an action: %s", cmd, orList(actions))
	}
	if !slices.Contains(actions, args[0]) {
		fmt.Fprint(stderr, usage)
		return "", nil, fmt.Errorf("%s: unknown action %q", cmd, args[0])
	}
	fs := flag.NewFlagSet(cmd+" "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	return args[0], fs, nil
}

// orList joins words as "a, b or c".
func orList(words []string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}
