// Command outboxchat runs the chat services, applies their schema, and runs
// the lab that proves and measures the outbox's guarantees.
//
//	outboxchat serve   --service consumers|workers [--role api,relay,worker] [--database-url URL] [--listen-database-url URL] [--redis-url URL] [--http ADDR]
//	outboxchat migrate --service consumers|workers [--database-url URL] [--redis-password-file F [--redis-admin-url URL]]
//	outboxchat token   --jwt-secret-file F --service S[,S] --user U --chats 1,2|* [--ttl 1h]
//	outboxchat lab up|chaos|scenario|latency|bench|demo|torture [flags]
//	outboxchat status [--database-url URL] [--redis-url URL] [--json]
//	outboxchat deadletters list|show|replay|drop [--service S] [--redis-url URL] [--json] [ID ...]
//	outboxchat outbox parked|retry --service S [--database-url URL] [--json]
//
// Every command is a file of its own (serve.go, lab_chaos.go, …), listed
// in one table (commands.go) that run dispatches from; the lab packages
// take plain option structs. See the README for the contracts.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		return // -h: the usage was printed; asking for it is not a failure
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "outboxchat:", err)
		os.Exit(1)
	}
}

// newLogger returns the commands' logger on w: text, or JSON lines with
// format "json".
func newLogger(w io.Writer, format string) *slog.Logger {
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, nil))
	}
	return slog.New(slog.NewTextHandler(w, nil))
}
