package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/cmd/outboxchat/internal/cliflag"
	"github.com/outboxchat/outboxchat/natsq"
	"github.com/outboxchat/outboxchat/redisq"
)

const deadlettersUsage = `usage: outboxchat deadletters <action> [flags] [ID ...]

actions (the dead letters of the stream SERVICE reads, i.e. its worker's):
  list    [--service S] [--after ID] [--count N]   oldest first; both services without --service
  show    --service S ID ...                        every field of the entries
  replay  --service S (ID ... | --all)              back on the stream, signature kept; a repeat is a no-op
  drop    --service S (ID ... | --all)              delete; a repeat is a no-op
flags: --redis-url URL, --redis-prefix P, --partition N (with serve --partitions: that partition's stream; default 0), --json,
  --broker-url nats://… (the queue on NATS JetStream, as given to serve: dead ids are dead-letter stream seqs)
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

// deadLetter is one dead letter of either broker, as deadLetterQueue
// reads it; DeadID is its id there (a Redis entry id, a dead-letter
// stream seq).
type deadLetter struct {
	DeadID, ID, Name, Reason, StreamID, Sig string
	At                                      time.Time
	Payload                                 []byte
}

func (d deadLetter) view(svc string, withPayload bool) deadLetterView {
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

// deadLetterResult is one replay or drop as printed. Done: replayed
// (StreamID is the new entry, on Redis) or dropped now; false when the
// entry was not there (done before).
type deadLetterResult struct {
	DeadID   string `json:"dead_id"`
	Done     bool   `json:"done"`
	StreamID string `json:"stream_id,omitempty"`
}

// deadLetterQueue is what deadletters needs of a broker's dead letters.
type deadLetterQueue interface {
	list(ctx context.Context, after string, count int) ([]deadLetter, error)
	get(ctx context.Context, id string) (deadLetter, bool, error)
	replay(ctx context.Context, ids ...string) ([]deadLetterResult, error)
	drop(ctx context.Context, ids ...string) ([]deadLetterResult, error)
}

// redisDeadLetters is deadLetterQueue on Redis Streams.
type redisDeadLetters struct{ d *redisq.DeadLetters }

func fromRedis(d redisq.DeadLetter) deadLetter {
	return deadLetter{DeadID: d.DeadID, ID: d.ID, Name: d.Name, Reason: d.Reason, StreamID: d.StreamID, Sig: d.Sig, At: d.At, Payload: d.Payload}
}

func (r redisDeadLetters) list(ctx context.Context, after string, count int) ([]deadLetter, error) {
	ds, err := r.d.List(ctx, after, count)
	out := make([]deadLetter, len(ds))
	for i, d := range ds {
		out[i] = fromRedis(d)
	}
	return out, err
}

func (r redisDeadLetters) get(ctx context.Context, id string) (deadLetter, bool, error) {
	d, ok, err := r.d.Get(ctx, id)
	return fromRedis(d), ok, err
}

func (r redisDeadLetters) replay(ctx context.Context, ids ...string) ([]deadLetterResult, error) {
	nids, err := r.d.Replay(ctx, ids...)
	res := make([]deadLetterResult, len(nids))
	for i, n := range nids {
		res[i] = deadLetterResult{DeadID: ids[i], Done: n != "", StreamID: n}
	}
	return res, err
}

func (r redisDeadLetters) drop(ctx context.Context, ids ...string) ([]deadLetterResult, error) {
	res := make([]deadLetterResult, 0, len(ids))
	for _, id := range ids {
		n, err := r.d.Drop(ctx, id)
		if err != nil {
			return res, err
		}
		res = append(res, deadLetterResult{DeadID: id, Done: n == 1})
	}
	return res, nil
}

// natsDeadLetters is deadLetterQueue on JetStream: ids are dead-letter
// stream seqs, in decimal.
type natsDeadLetters struct{ q *natsq.Queue }

func fromNATS(d natsq.DeadLetter) deadLetter {
	return deadLetter{DeadID: strconv.FormatUint(d.Seq, 10), ID: d.ID, Name: d.Name, Reason: d.Reason,
		StreamID: strconv.FormatUint(d.StreamSeq, 10), Sig: d.Sig, At: d.At, Payload: d.Payload}
}

// seqs parses dead ids as stream seqs.
func seqs(ids []string) ([]uint64, error) {
	out := make([]uint64, len(ids))
	for i, id := range ids {
		n, err := strconv.ParseUint(id, 10, 64)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("deadletters: dead id %q: on NATS a dead-letter stream seq (a positive integer)", id)
		}
		out[i] = n
	}
	return out, nil
}

func (n natsDeadLetters) list(ctx context.Context, after string, count int) ([]deadLetter, error) {
	var from uint64
	if after != "" {
		s, err := seqs([]string{after})
		if err != nil {
			return nil, err
		}
		from = s[0]
	}
	ds, err := n.q.DeadLetters(ctx, from, count)
	out := make([]deadLetter, len(ds))
	for i, d := range ds {
		out[i] = fromNATS(d)
	}
	return out, err
}

func (n natsDeadLetters) get(ctx context.Context, id string) (deadLetter, bool, error) {
	s, err := seqs([]string{id})
	if err != nil {
		return deadLetter{}, false, err
	}
	d, ok, err := n.q.DeadLetterAt(ctx, s[0])
	return fromNATS(d), ok, err
}

func (n natsDeadLetters) replay(ctx context.Context, ids ...string) ([]deadLetterResult, error) {
	s, err := seqs(ids)
	if err != nil {
		return nil, err
	}
	done, err := n.q.Replay(ctx, s...)
	res := make([]deadLetterResult, len(done))
	for i, ok := range done {
		res[i] = deadLetterResult{DeadID: ids[i], Done: ok}
	}
	return res, err
}

func (n natsDeadLetters) drop(ctx context.Context, ids ...string) ([]deadLetterResult, error) {
	s, err := seqs(ids)
	if err != nil {
		return nil, err
	}
	res := make([]deadLetterResult, 0, len(ids))
	for i, seq := range s {
		ok, err := n.q.DropDeadLetter(ctx, seq)
		if err != nil {
			return res, err
		}
		res = append(res, deadLetterResult{DeadID: ids[i], Done: ok})
	}
	return res, nil
}

// runDeadletters runs `outboxchat deadletters list|show|replay|drop`.
func runDeadletters(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	action, fs, err := parseAction("deadletters", deadlettersUsage, []string{"list", "show", "replay", "drop"}, args, stderr)
	if err != nil {
		return err
	}
	f := newOpsFlags(fs, false, true)
	svc := fs.String("service", "", "the service whose worker dead-lettered the entries (it reads the other's stream)")
	after := fs.String("after", "", "list: start after this dead-letter id")
	count := fs.Int("count", 100, "list: at most this many per service")
	all := fs.Bool("all", false, "replay, drop: every entry")
	partition := fs.Int("partition", 0, "the partition whose stream's dead letters to use (serve --partitions; 0 without partitions)")
	logFormat := fs.String("log-format", "text", "log format (stderr): text or json")
	brokerURL := cliflag.EnvString(fs, "broker-url", "BROKER_URL", "the queue on NATS JetStream, as given to serve (default $BROKER_URL, else \"\": Redis Streams on --redis-url)")
	ids, err := parseInterleaved(fs, args[1:])
	if err != nil {
		return err
	}
	if *partition < 0 || *partition >= chat.MaxPartitions {
		return fmt.Errorf("deadletters: --partition %d out of range", *partition)
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
	log := newLogger(stderr, *logFormat).With("command", "deadletters "+action)
	tools := map[string]deadLetterQueue{}
	if *brokerURL != "" {
		nc, err := natsq.Connect(*brokerURL, nats.Name("outboxchat-deadletters"), nats.MaxReconnects(0))
		if err != nil {
			return fmt.Errorf("deadletters: %w", err)
		}
		defer nc.Close()
		for _, s := range services {
			q, err := natsq.Open(ctx, nc, natsq.Config{Queue: chat.NATSName(chat.PartitionQueue(chat.Peer(s), *partition)), Prefix: chat.NATSName(*f.prefix)})
			if errors.Is(err, jetstream.ErrStreamNotFound) && action == "list" {
				continue // no queue yet: nothing dead-lettered
			}
			if err != nil {
				return fmt.Errorf("deadletters: %w (has serve --broker-url run against this server?)", err)
			}
			tools[s] = natsDeadLetters{q}
		}
	} else {
		rdb, err := f.redis("deadletters")
		if err != nil {
			return err
		}
		defer rdb.Close()
		for _, s := range services {
			d, err := redisq.NewDeadLetters(rdb, *f.prefix, chat.PartitionQueue(chat.Peer(s), *partition), 0, log)
			if err != nil {
				return err
			}
			tools[s] = redisDeadLetters{d}
		}
	}
	switch action {
	case "list":
		out := []deadLetterView{}
		for _, s := range services {
			if tools[s] == nil {
				continue
			}
			ds, err := tools[s].list(ctx, *after, *count)
			if err != nil {
				return err
			}
			for _, d := range ds {
				out = append(out, d.view(s, false))
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
			d, ok, err := tools[*svc].get(ctx, id)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("deadletters show: no dead letter %s on %s", id, chat.PartitionQueue(chat.Peer(*svc), *partition))
			}
			out = append(out, d.view(*svc, true))
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
			ds, err := tools[*svc].list(ctx, last, 1000)
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
	var res []deadLetterResult
	if action == "replay" {
		res, err = tools[*svc].replay(ctx, ids...)
	} else {
		res, err = tools[*svc].drop(ctx, ids...)
	}
	if err != nil {
		return err
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
