package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/status"
	"github.com/outboxchat/outboxchat/cmd/outboxchat/internal/cliflag"
	"github.com/outboxchat/outboxchat/redisq"
)

// opsFlags are the connection and output flags the operator commands share.
type opsFlags struct {
	dbURL, redisURL, prefix *string
	asJSON                  *bool
}

func newOpsFlags(fs *flag.FlagSet, db, rds bool) opsFlags {
	var f opsFlags
	if db {
		f.dbURL = cliflag.EnvString(fs, "database-url", "DATABASE_URL", "Postgres URL (default $DATABASE_URL): a role that can read the service schemas, e.g. the database owner")
	}
	if rds {
		f.redisURL = cliflag.EnvString(fs, "redis-url", "REDIS_URL", "Redis URL (default $REDIS_URL)")
		f.prefix = fs.String("redis-prefix", chat.DefaultRedisPrefix, "prefix of every Redis key (as given to serve)")
	}
	f.asJSON = fs.Bool("json", false, "print JSON instead of text")
	return f
}

// commandFlags are the connection flags given on fs's command line, for
// the commands a report suggests: a flag left to its environment variable
// is left out, since the suggested command finds it there too.
func (f opsFlags) commandFlags(fs *flag.FlagSet) status.CommandFlags {
	var cf status.CommandFlags
	fs.Visit(func(fl *flag.Flag) {
		arg := "--" + fl.Name + " " + shellQuote(fl.Value.String())
		switch fl.Name {
		case "database-url":
			cf.Database = arg
		case "redis-url", "redis-prefix":
			cf.Redis = strings.TrimSpace(cf.Redis + " " + arg)
			if fl.Name == "redis-prefix" {
				cf.Broker = strings.TrimSpace(cf.Broker + " " + arg)
			}
		case "broker-url":
			cf.Broker = strings.TrimSpace(cf.Broker + " " + arg)
		}
	})
	return cf
}

// shellQuote quotes s for a POSIX shell (single quotes; a quote inside as
// '\”) unless it is made of characters no shell treats specially.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:@%+=,", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
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

func (f opsFlags) redis(cmd string) (redis.UniversalClient, error) {
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

// parseAction reads the action of `outboxchat <cmd> <action> [flags]`
// (args[0], one of actions) and returns it with a FlagSet named
// "<cmd> <action>" that reports to stderr. -h or --help instead of an
// action prints usage and returns flag.ErrHelp, as a command's -h does; a
// missing or unknown action prints usage and is an error.
func parseAction(cmd, usage string, actions, args []string, stderr io.Writer) (string, *flag.FlagSet, error) {
	if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		fmt.Fprint(stderr, usage)
		fmt.Fprintf(stderr, "run 'outboxchat %s <action> -h' for an action's flags\n", cmd)
		return "", nil, flag.ErrHelp
	}
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

// parseInterleaved parses args with fs, flags and positional arguments in
// any order ("replay ID --service S" as well as "replay --service S ID"),
// and returns the positional ones.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := cliflag.Parse(fs, args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// checkServiceFlag reports a --service flag that is missing or names no
// service as a flag error of cmd (cliflag.Usagef: the error, the -h hint,
// exit 2): serve, migrate, prune and outbox need exactly one service.
func checkServiceFlag(fs *flag.FlagSet, cmd, service string) error {
	switch {
	case service == "":
		return cliflag.Usagef(fs, "%s: --service is required: consumers or workers", cmd)
	case chat.Peer(service) == "":
		return cliflag.Usagef(fs, "%s: --service %q: want consumers or workers", cmd, service)
	}
	return nil
}
