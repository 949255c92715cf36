package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/outboxchat/outboxchat/chat/store/prune"
	"github.com/outboxchat/outboxchat/cmd/outboxchat/internal/cliflag"
)

// runPrune runs `outboxchat prune`: one pass of what `serve
// --history-retention` does every minute (prune.Run), printing the rows
// deleted by table.
func runPrune(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("prune", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := newOpsFlags(fs, true, false)
	svc := fs.String("service", "", "consumers or workers (required)")
	older := fs.Duration("older-than", 0, "delete history older than this, e.g. 720h (required, above 0)")
	batch := fs.Int("batch", prune.DefaultBatch, "at most this many rows per DELETE")
	if err := cliflag.Parse(fs, args); err != nil {
		return err
	}
	if err := checkServiceFlag(fs, "prune", *svc); err != nil {
		return err
	}
	if *older <= 0 {
		return errors.New("prune: --older-than: want a duration above 0, e.g. 720h")
	}
	pool, err := f.pool(ctx, "prune")
	if err != nil {
		return err
	}
	defer pool.Close()
	start := time.Now()
	n, err := prune.Run(ctx, pool, prune.Config{Service: *svc, OlderThan: *older, Batch: *batch})
	if err != nil {
		return err
	}
	if *f.asJSON {
		return printJSON(stdout, map[string]any{"service": *svc, "older_than": older.String(), "deleted": n,
			"total": n.Total(), "seconds": time.Since(start).Seconds()})
	}
	fmt.Fprintf(stdout, "prune %s older than %v: %d rows deleted in %.1fs\n", *svc, *older, n.Total(), time.Since(start).Seconds())
	for _, t := range prune.Tables {
		fmt.Fprintf(stdout, "  %-17s %d\n", t, n[t])
	}
	return nil
}
