package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/schema"
	"github.com/outboxchat/outboxchat/cmd/outboxchat/internal/cliflag"
	"github.com/outboxchat/outboxchat/redisq"
)

// runMigrate runs `outboxchat migrate`: the service's role and schema
// (with a superuser URL), its migrations, and its Redis ACL user.
func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	service := fs.String("service", "", "consumers or workers (required)")
	dbURL := cliflag.EnvString(fs, "database-url", "DATABASE_URL", "Postgres URL; a superuser URL also creates the role and schema (default $DATABASE_URL)")
	acl := redisACLFlags(fs)
	if err := cliflag.Parse(fs, args); err != nil {
		return err
	}
	if err := checkServiceFlag(fs, "migrate", *service); err != nil {
		return err
	}
	if acl.wanted() {
		if err := acl.run(ctx, *service, stdout); err != nil {
			return err
		}
		if *dbURL == "" {
			return nil // the Redis user only
		}
	}
	if *dbURL == "" {
		return errors.New("migrate: no database URL (--database-url or DATABASE_URL)")
	}
	pool, err := pgxpool.New(ctx, *dbURL)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer pool.Close()
	if err := schema.CheckPooler(ctx, pool, nil); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	var canCreate bool
	if err := pool.QueryRow(ctx, `SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user`).Scan(&canCreate); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if canCreate {
		if err := schema.Bootstrap(ctx, pool, *service); err != nil {
			return err
		}
	}
	n, err := schema.Migrate(ctx, pool, *service)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: %d migration(s) applied\n", *service, n)
	return nil
}

// redisACLFlagSet holds migrate's Redis ACL flags.
type redisACLFlagSet struct {
	passwordFile, adminURL, user, prefix *string
	partitions                           *int
}

func redisACLFlags(fs *flag.FlagSet) *redisACLFlagSet {
	return &redisACLFlagSet{
		passwordFile: fs.String("redis-password-file", "", "make the service's least-privilege Redis user with this file's password: print its ACL SETUSER line, or apply it with --redis-admin-url"),
		adminURL:     fs.String("redis-admin-url", "", "Redis URL of an administrator: apply the ACL SETUSER line (and ACL SAVE) instead of printing it"),
		user:         fs.String("redis-user", "", "the service's Redis user name (default the service name)"),
		prefix:       fs.String("redis-prefix", chat.DefaultRedisPrefix, "the services' --redis-prefix (the user's keys)"),
		partitions:   cliflag.EnvInt(fs, "partitions", "OUTBOXCHAT_PARTITIONS", chat.DefaultPartitions, "the services' --partitions: the ACL covers every partition's streams (default $OUTBOXCHAT_PARTITIONS, else 1)"),
	}
}

func (a *redisACLFlagSet) wanted() bool { return *a.passwordFile != "" }

// run prints or applies service's ACL SETUSER line.
func (a *redisACLFlagSet) run(ctx context.Context, service string, stdout io.Writer) error {
	b, err := os.ReadFile(*a.passwordFile)
	if err != nil {
		return fmt.Errorf("migrate: redis password: %w", err)
	}
	user := *a.user
	if user == "" {
		user = service
	}
	args, err := schema.RedisACLPartitions(service, *a.prefix, user, strings.TrimSpace(string(b)), *a.partitions)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if *a.adminURL == "" {
		fmt.Fprintln(stdout, schema.RedisACLLine(args))
		return nil
	}
	rdb, err := redisq.NewClient(*a.adminURL)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer rdb.Close()
	if err := schema.ApplyRedisACL(ctx, rdb, args); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	fmt.Fprintf(stdout, "%s: redis user %s set\n", service, user)
	return nil
}
