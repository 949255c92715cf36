package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/cmd/outboxchat/internal/cliflag"
	"github.com/outboxchat/outboxchat/outbox"
)

const outboxUsage = `usage: outboxchat outbox <action> --service S [flags]

actions:
  parked  [--limit N]              the parked rows (publish failed --relay-max-attempts times)
  retry   (--id N[,N...] | --all)  put parked rows back in line (new row ids); a repeat is a no-op
flags: --database-url URL, --partition N (with serve --partitions: that partition's outbox table; default 0), --json
`

// runOutbox runs `outboxchat outbox parked|retry`.
func runOutbox(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	action, fs, err := parseAction("outbox", outboxUsage, []string{"parked", "retry"}, args, stderr)
	if err != nil {
		return err
	}
	f := newOpsFlags(fs, true, false)
	svc := fs.String("service", "", "consumers or workers (required)")
	limit := fs.Int("limit", 100, "parked: at most this many rows (0 = all)")
	idList := fs.String("id", "", "retry: comma-separated row ids")
	all := fs.Bool("all", false, "retry: every parked row")
	partition := fs.Int("partition", 0, "the partition whose outbox table to use (serve --partitions; 0 without partitions)")
	logFormat := fs.String("log-format", "text", "log format (stderr): text or json")
	if err := cliflag.Parse(fs, args[1:]); err != nil {
		return err
	}
	if err := checkServiceFlag(fs, "outbox "+action, *svc); err != nil {
		return err
	}
	if *partition < 0 || *partition >= chat.MaxPartitions {
		return fmt.Errorf("outbox %s: --partition %d out of range", action, *partition)
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
	table := chat.OutboxTable(*svc, *partition)
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
	re, err := outbox.Retry(ctx, pool, table, chat.PartitionOutboxChannel(*svc, *partition), ids)
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
