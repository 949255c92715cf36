package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/trace"
	"github.com/outboxchat/outboxchat/cmd/outboxchat/internal/cliflag"
)

// runTrace prints one message's way across both services: `outboxchat
// trace --message-id ID` or `--chat N --seq S [--service S]`.
func runTrace(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("trace", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := newOpsFlags(fs, true, true)
	id := fs.String("message-id", "", "the message's id (a UUID)")
	chatID := fs.Int64("chat", 0, "the message's chat id (with --seq, instead of --message-id)")
	seq := fs.Int64("seq", 0, "the message's seq in its chat (with --chat)")
	service := fs.String("service", "", "with --chat and --seq: the sending service (consumers or workers), when both have that seq")
	if err := cliflag.Parse(fs, args); err != nil {
		return err
	}
	byID, bySeq := *id != "", *chatID != 0 || *seq != 0
	if byID == bySeq || (bySeq && (*chatID <= 0 || *seq <= 0)) {
		fmt.Fprintln(stderr, "usage: outboxchat trace --message-id ID | --chat N --seq S [--service S] [--json] [--database-url URL] [--redis-url URL]")
		return errors.New("trace: give --message-id, or --chat and --seq (both positive)")
	}
	if byID {
		if _, err := chat.ParseMessageID(*id); err != nil {
			return cliflag.Usagef(fs, "trace: --message-id %q: want a message's id, a UUID such as 0190f1a2-7c3e-7abc-8def-0123456789ab", *id)
		}
	}
	pool, err := f.pool(ctx, "trace")
	if err != nil {
		return err
	}
	defer pool.Close()
	var rdb redis.UniversalClient
	if *f.redisURL != "" {
		c, err := f.redis("trace")
		if err != nil {
			return err
		}
		defer c.Close()
		rdb = c
	}
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if bySeq {
		if *id, err = trace.Find(qctx, pool, *service, *chatID, *seq); err != nil {
			return err
		}
	}
	tr, err := trace.ByID(qctx, pool, rdb, *id, trace.Options{Prefix: *f.prefix})
	if err != nil {
		return err
	}
	if *f.asJSON {
		return printJSON(stdout, tr)
	}
	writeTrace(stdout, tr)
	return nil
}

func writeTrace(w io.Writer, tr *trace.Trace) {
	fmt.Fprintf(w, "message %s: %s → %s, chat %d seq %d\n", tr.MessageID, tr.Service, tr.Receiver, tr.ChatID, tr.Seq)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "at\tstage\tservice\tstate\tdetails")
	for _, s := range tr.Stages {
		at := "?"
		if s.At != nil {
			at = s.At.UTC().Format("2006-01-02T15:04:05.000000Z")
		}
		state := s.State
		if state == trace.StateNotRead {
			state = "unknown (Redis not read)" // as status says of drained
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", at, s.Stage, s.Service, state, details(s))
	}
	_ = tw.Flush()
	for _, e := range tr.Errors {
		fmt.Fprintln(w, "not read:", e)
	}
}

// details is a stage's other fields, "key=value" each.
func details(s trace.Stage) string {
	var d []string
	add := func(k string, v any, set bool) {
		if set {
			d = append(d, fmt.Sprintf("%s=%v", k, v))
		}
	}
	add("stream_id", s.StreamID, s.StreamID != "")
	add("dead_id", s.DeadID, s.DeadID != "")
	add("consumer", s.Consumer, s.Consumer != "")
	add("deliveries", s.Deliveries, s.Deliveries > 0)
	add("attempts", s.Attempts, s.Attempts > 0)
	add("failures", s.Failures, s.Failures > 0)
	add("redrives", s.Redrives, s.Redrives > 0)
	add("duplicates_skipped", s.Duplicates, s.Duplicates > 0)
	add("upto_seq", s.UptoSeq, s.UptoSeq > 0)
	add("reason", fmt.Sprintf("%q", s.Reason), s.Reason != "")
	return strings.Join(d, " ")
}
