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
// Every command is a file of its own (serve.go, internal/labcmd/chaos.go,
// …), listed in one table (commands.go) that run dispatches from; the lab
// commands, in internal/labcmd, give the lab packages plain option structs.
// See the README for the contracts.
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
	"strings"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/cmd/outboxchat/internal/cliflag"
	"github.com/outboxchat/outboxchat/cmd/outboxchat/internal/labcmd"
	"github.com/outboxchat/outboxchat/internal/pgproc"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		return // -h: the usage was printed; asking for it is not a failure
	}
	if pe := (*cliflag.ParseError)(nil); errors.As(err, &pe) {
		os.Exit(2) // cliflag.Parse printed the error, with a hint to run -h
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "outboxchat:", err)
		os.Exit(1)
	}
}

// run runs `outboxchat <args>`: the command named by args[0] (and, for
// lab, args[1]) with the rest. The report goes to stdout, progress and
// usage to stderr; -h prints the usage to stdout.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "lab" {
		// Every private Postgres of a lab run starts from one template
		// cluster made by the first; remove it when the command ends.
		defer func() { _ = pgproc.RemoveTemplate() }()
		return dispatch(ctx, group{prefix: "lab ", usage: labcmd.Usage, help: flag.ErrHelp}, args[1:], stdout, stderr)
	}
	redis.SetLogger(redisLogger{}) // serve sets its own
	return dispatch(ctx, group{usage: usage}, args, stdout, stderr)
}

// group is a level of the command names: the top one (prefix "") or the
// lab's ("lab "), with its usage and what asking it for help returns (nil
// at the top; flag.ErrHelp for lab, as for a command's -h).
type group struct {
	prefix, usage string
	help          error
}

// dispatch runs the command of g named by args[0] with the rest. No name
// or an unknown one prints g's usage to stderr and is an error; -h prints
// it to stdout.
func dispatch(ctx context.Context, g group, args []string, stdout, stderr io.Writer) error {
	errPrefix := strings.TrimSuffix(g.prefix, " ")
	if errPrefix != "" {
		errPrefix += ": "
	}
	if len(args) == 0 {
		fmt.Fprint(stderr, g.usage)
		return errors.New(errPrefix + "no command")
	}
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, g.usage)
		return g.help
	}
	if c := lookup(g.prefix + args[0]); c != nil && !strings.Contains(args[0], " ") {
		return c.run(ctx, args[1:], stdout, stderr)
	}
	fmt.Fprint(stderr, g.usage)
	return fmt.Errorf("%sunknown command %q", errPrefix, args[0])
}

// newLogger returns the commands' logger on w: text, or JSON lines with
// format "json".
func newLogger(w io.Writer, format string) *slog.Logger {
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, nil))
	}
	return slog.New(slog.NewTextHandler(w, nil))
}
