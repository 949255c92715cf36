package schema

import (
	"fmt"
	"net/url"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultPoolMaxConns is the size of a service's database pool when the
// database URL sets no pool_max_conns.
//
// What each role holds at a time (connections of the pool; the process's
// one LISTEN connection, on ListenDatabaseURL when set, is opened outside
// it):
//
//   - api: the group committer 1, plus one per slow lane (chats waiting for
//     their locks: a quarter of the pool, 1 to 4), one per history request
//     and gateway read in flight, and the post-commit NOTIFY 1;
//   - relay: 1 per pass;
//   - worker: 1 per inbox batch.
//
// No role holds one connection while it waits for another, so any size of
// at least 1 works; a smaller pool makes the roles queue for connections
// (the wait counts against each request's timeouts). 16 leaves room for
// all three roles in one process under the lab bench's load.
const DefaultPoolMaxConns = 16

// PoolConfig parses a service's database URL with pgxpool.ParseConfig, so
// every pgxpool parameter it carries (pool_max_conns, pool_min_conns,
// pool_max_conn_lifetime, pool_max_conn_idle_time,
// pool_health_check_period, …) is honoured as given; without
// pool_max_conns the pool gets DefaultPoolMaxConns. An invalid value is
// pgxpool's error (e.g. pool_max_conns=0 is refused).
func PoolConfig(databaseURL string) (*pgxpool.Config, error) {
	return PoolConfigPartitions(databaseURL, 1)
}

// PoolConfigPartitions is PoolConfig for a process with partitions
// partitions per direction (serve --partitions): without pool_max_conns
// the pool gets DefaultPoolMaxConns plus 3 per partition beyond the first
// (its relay's pass, its inbox batch and its writer's post-commit NOTIFY
// may each hold one at a time).
func PoolConfigPartitions(databaseURL string, partitions int) (*pgxpool.Config, error) {
	pcfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("serve: database url: %w", err)
	}
	if !setsPoolMaxConns(databaseURL) {
		pcfg.MaxConns = DefaultPoolMaxConns + 3*int32(max(partitions-1, 0))
	}
	return pcfg, nil
}

var dsnMaxConnsRe = regexp.MustCompile(`(^|\s)pool_max_conns\s*=`)

// setsPoolMaxConns reports whether a URL (postgres://…?pool_max_conns=N) or
// keyword/value connection string (… pool_max_conns=N) sets pool_max_conns.
func setsPoolMaxConns(s string) bool {
	if strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://") {
		u, err := url.Parse(s)
		return err == nil && u.Query().Has("pool_max_conns")
	}
	return dsnMaxConnsRe.MatchString(s)
}
