package main

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/redisq"
)

// serverSettings reads back, from the servers a `lab up` printed, the
// settings --durable is about: Postgres fsync and synchronous_commit, Redis
// appendonly and appendfsync.
func serverSettings(t *testing.T, lines map[string]string) (fsync, syncCommit, appendonly, appendfsync string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, lines["database"])
	if err != nil {
		t.Fatalf("connect %s: %v", lines["database"], err)
	}
	defer conn.Close(context.Background())
	if err := conn.QueryRow(ctx, "SELECT current_setting('fsync'), current_setting('synchronous_commit')").Scan(&fsync, &syncCommit); err != nil {
		t.Fatal(err)
	}
	rc, err := redisq.NewClient(lines["redis"])
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	cfg, err := rc.ConfigGet(ctx, "append*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return fsync, syncCommit, cfg["appendonly"], cfg["appendfsync"]
}

// lab up --durable runs the servers as production does, read back from the
// running servers; without the flag Postgres runs the fast mode (fsync off).
func TestUpDurableSetsTheServers(t *testing.T) {
	t.Parallel()
	durable := startUp(t, "redis", "--durable")
	fast := startUp(t, "redis")
	for _, tc := range []struct {
		name  string
		u     *upRun
		fsync string
	}{{"--durable", durable, "on"}, {"default", fast, "off"}} {
		fsync, sc, ao, af := serverSettings(t, tc.u.lines)
		if fsync != tc.fsync || sc != "on" || ao != "yes" || af != "everysec" {
			t.Errorf("lab up %s: fsync=%s synchronous_commit=%s appendonly=%s appendfsync=%s; want fsync=%s, synchronous_commit=on, appendonly=yes, appendfsync=everysec",
				tc.name, fsync, sc, ao, af, tc.fsync)
		}
	}
}
