package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/redisq"
)

const deadlettersUsage = `usage: outboxchat deadletters <action> [flags] [ID ...]

actions (the dead letters of the stream SERVICE reads, i.e. its worker's):
  list    [--service S] [--after ID] [--count N]   oldest first; both services without --service
  show    --service S ID ...                        every field of the entries
  replay  --service S (ID ... | --all)              back on the stream, signature kept; a repeat is a no-op
  drop    --service S (ID ... | --all)              delete; a repeat is a no-op
flags: --redis-url URL, --redis-prefix P, --partition N (with serve --partitions: that partition's stream; default 0), --json
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
	rdb, err := f.redis("deadletters")
	if err != nil {
		return err
	}
	defer rdb.Close()
	log := newLogger(stderr, *logFormat).With("command", "deadletters "+action)
	tools := map[string]*redisq.DeadLetters{}
	for _, s := range services {
		if tools[s], err = redisq.NewDeadLetters(rdb, *f.prefix, chat.PartitionQueue(chat.Peer(s), *partition), 0, log); err != nil {
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
				return fmt.Errorf("deadletters show: no dead letter %s on %s", id, chat.PartitionQueue(chat.Peer(*svc), *partition))
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
