package pgproc

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// baseBackup fills s.dataDir with a pg_basebackup of primary, written as a
// standby (-R: standby.signal and primary_conninfo pointing at primary),
// with the WAL it needs streamed alongside (-X stream). initdb's default
// pg_hba.conf already trusts replication connections from 127.0.0.1, and
// PostgreSQL 15's defaults (wal_level=replica, max_wal_senders=10) allow
// them: the primary needs no setting of its own.
func (s *Server) baseBackup(ctx context.Context, primary *Server) error {
	if err := s.makeDataDir(); err != nil {
		return err
	}
	// A bin dir of symlinks to initdb and postgres (e.g. /usr/local/bin)
	// may lack pg_basebackup: it sits beside the real postgres.
	tool := "pg_basebackup"
	if _, err := os.Stat(filepath.Join(s.binDir, tool)); err != nil {
		if real, err := filepath.EvalSymlinks(filepath.Join(s.binDir, "postgres")); err == nil {
			tool = filepath.Join(filepath.Dir(real), tool)
		}
	}
	return s.runTool(ctx, tool, "basebackup.log", "-D", s.dataDir, "-h", "127.0.0.1", "-p", strconv.Itoa(primary.Port()),
		"-U", "postgres", "-X", "stream", "-R", "-c", "fast", "--no-sync")
}

// WaitCaughtUp waits until the standby s has replayed all the WAL its
// primary had written when WaitCaughtUp was called (pg_current_wal_lsn on
// primary, pg_last_wal_replay_lsn on s). It returns ctx's error, or one
// naming both positions after timeout (0 means 30s).
func (s *Server) WaitCaughtUp(ctx context.Context, primary *Server, timeout time.Duration) error {
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	var target string
	if err := queryRow(ctx, primary.AdminURL(), "SELECT pg_current_wal_lsn()::text", nil, &target); err != nil {
		return fmt.Errorf("pgproc: primary's wal position: %w", err)
	}
	deadline := time.Now().Add(timeout)
	for {
		var caughtUp bool
		var at string
		err := queryRow(ctx, s.AdminURL(), "SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false), coalesce(pg_last_wal_replay_lsn()::text, '')",
			[]any{target}, &caughtUp, &at)
		if err == nil && caughtUp {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("replayed up to %q of %s", at, target)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgproc: standby not caught up after %v: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// CutReplication stops the standby s from following its primary: its
// primary_conninfo is emptied (ALTER SYSTEM, reloaded), which stops its
// WAL receiver. What the primary commits afterwards never reaches s, as
// when the network between an asynchronous replica and its primary fails.
// It returns once s has no WAL receiver.
func (s *Server) CutReplication(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, s.AdminURL())
	if err != nil {
		return fmt.Errorf("pgproc: connect to standby: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "ALTER SYSTEM SET primary_conninfo = ''"); err != nil {
		return fmt.Errorf("pgproc: cut replication: %w", err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("pgproc: reload standby: %w", err)
	}
	deadline := time.Now().Add(s.startTimeout)
	for {
		var receivers int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_wal_receiver").Scan(&receivers); err != nil {
			return fmt.Errorf("pgproc: read wal receiver: %w", err)
		}
		if receivers == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgproc: standby's wal receiver still running after %v", s.startTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Promote makes the standby s a primary (pg_promote, waiting up to 60s for
// the promotion to finish): it starts a new timeline and accepts writes.
func (s *Server) Promote(ctx context.Context) error {
	var ok bool
	if err := queryRow(ctx, s.AdminURL(), "SELECT pg_promote(true, 60)", nil, &ok); err != nil {
		return fmt.Errorf("pgproc: promote: %w", err)
	}
	if !ok {
		return fmt.Errorf("pgproc: promote: not promoted within 60s")
	}
	return nil
}

// queryRow runs query with args on a new connection to url and scans its
// one row into dest.
func queryRow(ctx context.Context, url, query string, args []any, dest ...any) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return conn.QueryRow(ctx, query, args...).Scan(dest...)
}
