package schema

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/outboxchat/outboxchat/chat"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

type migration struct {
	version int
	name    string
	sql     string
}

func migrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFS, "migrations")
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	var ms []migration
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("migration %q: name must start with a number and '_'", e.Name())
		}
		b, err := migrationFS.ReadFile("migrations/" + e.Name())
		if err != nil {
			return nil, fmt.Errorf("read migration %q: %w", e.Name(), err)
		}
		ms = append(ms, migration{version: v, name: e.Name(), sql: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	return ms, nil
}

// Bootstrap creates the service's role (LOGIN, no password: set one yourself
// where auth is not trust) and its schema owned by that role, and grants the
// role CONNECT on the current database. It needs a connection with the
// CREATEROLE privilege on a database the caller owns (the lab's superuser,
// or a managed service's admin user, which it makes a member of the role:
// CREATE SCHEMA … AUTHORIZATION and Migrate's SET ROLE need that). It
// is idempotent and safe to run concurrently with itself (advisory lock).
//
// The role gets no rights on the other service's schema: consumers cannot read
// workers.inbox, and the reverse.
func Bootstrap(ctx context.Context, pool *pgxpool.Pool, service string) error {
	if err := chat.CheckService(service); err != nil {
		return err
	}
	// Roles are cluster-wide and the advisory lock is per database: when
	// another database's bootstrap creates the role at the same moment, this
	// transaction's CREATE ROLE fails as a duplicate (caught), but its
	// catalog cache may still hold the role as missing until the next
	// transaction, so CREATE SCHEMA … AUTHORIZATION fails with 42704. A new
	// transaction sees the committed role.
	var err error
	for range 3 {
		err = bootstrapOnce(ctx, pool, service)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42704" {
			return err
		}
	}
	return err
}

func bootstrapOnce(ctx context.Context, pool *pgxpool.Pool, service string) error {
	id := pgx.Identifier{service}.Sanitize()
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('outboxchat.bootstrap'))`); err != nil {
			return fmt.Errorf("bootstrap %s: lock: %w", service, err)
		}
		// Roles are cluster-wide and advisory locks per database: another
		// database's bootstrap may create the role at the same moment.
		var super bool // or the service's role itself
		if err := tx.QueryRow(ctx, `SELECT rolsuper OR rolname = $1 FROM pg_roles WHERE rolname = current_user`, service).Scan(&super); err != nil {
			return fmt.Errorf("bootstrap %s: look up current user: %w", service, err)
		}
		stmts := []string{
			`DO $$ BEGIN CREATE ROLE ` + id + ` LOGIN;
			EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$`,
		}
		if !super {
			// A CREATEROLE admin (a managed service's) must be a member of
			// the role to give it a schema and to SET ROLE to it in Migrate:
			// PostgreSQL 15 does not make it one, 16 only with ADMIN OPTION.
			stmts = append(stmts, "GRANT "+id+" TO CURRENT_USER")
		}
		stmts = append(stmts,
			"CREATE SCHEMA IF NOT EXISTS "+id+" AUTHORIZATION "+id,
			"GRANT CONNECT ON DATABASE "+pgx.Identifier{currentDatabase(ctx, tx)}.Sanitize()+" TO "+id,
		)
		for _, s := range stmts {
			if _, err := tx.Exec(ctx, s); err != nil {
				return fmt.Errorf("bootstrap %s: %s: %w", service, s, err)
			}
		}
		return nil
	})
}

func currentDatabase(ctx context.Context, tx pgx.Tx) string {
	var db string
	if err := tx.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		return "postgres"
	}
	return db
}

// Migrate applies the embedded migrations that are not yet applied to the
// service's schema, each in its own transaction, recorded in
// <service>.schema_migrations. The schema must exist (Bootstrap). When the
// connected user is not the service's role but may act as it (a superuser),
// the migrations run under SET ROLE so the tables belong to the service's
// role. Concurrent calls are serialised by an advisory lock. It returns the
// number of migrations applied.
func Migrate(ctx context.Context, pool *pgxpool.Pool, service string) (int, error) {
	return MigrateUpTo(ctx, pool, service, math.MaxInt)
}

// MigrateUpTo is Migrate without the migrations above version upto (tests
// of a migration's data changes start from the version before it).
func MigrateUpTo(ctx context.Context, pool *pgxpool.Pool, service string, upto int) (int, error) {
	if err := chat.CheckService(service); err != nil {
		return 0, err
	}
	ms, err := migrations()
	if err != nil {
		return 0, err
	}
	schema := pgx.Identifier{service}.Sanitize()
	applied := 0
	for _, m := range ms {
		if m.version > upto {
			break
		}
		done := false
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := lockMigrations(ctx, tx, service); err != nil {
				return err
			}
			var hasSchema bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, service).Scan(&hasSchema); err != nil {
				return fmt.Errorf("look up schema: %w", err)
			}
			if !hasSchema {
				return fmt.Errorf("schema %s does not exist: run `outboxchat migrate --service %s` with a superuser --database-url first", service, service)
			}
			if err := actAsService(ctx, tx, service); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "SET LOCAL search_path = "+schema); err != nil {
				return fmt.Errorf("set search_path: %w", err)
			}
			if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
				version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
				return fmt.Errorf("create schema_migrations: %w", err)
			}
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM schema_migrations WHERE version = $1)`, m.version).Scan(&done); err != nil {
				return fmt.Errorf("read schema_migrations: %w", err)
			}
			if done {
				return nil
			}
			if _, err := tx.Exec(ctx, m.sql); err != nil {
				return fmt.Errorf("apply: %w", err)
			}
			_, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`, m.version, m.name)
			return err
		})
		if err != nil {
			return applied, fmt.Errorf("migrate %s %s: %w", service, m.name, err)
		}
		if !done {
			applied++
		}
	}
	return applied, nil
}

// lockMigrations takes, in tx, the advisory lock that makes the migrations
// and partition tables of service one at a time across processes.
func lockMigrations(ctx context.Context, tx pgx.Tx, service string) error {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('outboxchat.migrate.' || $1))`, service); err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	return nil
}

// actAsService makes tx run as service's role (SET LOCAL ROLE, unless the
// session already is that role), so that what it creates belongs to the
// service.
func actAsService(ctx context.Context, tx pgx.Tx, service string) error {
	var user string
	if err := tx.QueryRow(ctx, `SELECT current_user`).Scan(&user); err != nil {
		return fmt.Errorf("current user: %w", err)
	}
	if user != service {
		if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+pgx.Identifier{service}.Sanitize()); err != nil {
			return fmt.Errorf("set role %s: %w", service, err)
		}
	}
	return nil
}
