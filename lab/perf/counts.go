package perf

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/outboxchat/outboxchat/lab/env"
)

// countSettings preload pg_stat_statements, which BenchOptions.Counts
// reads; tracking "all" counts the statements of PL/pgSQL functions too.
var countSettings = []string{"shared_preload_libraries=pg_stat_statements", "pg_stat_statements.track=all",
	"pg_stat_statements.max=5000"}

// WorkCount is one line of the work counted per message
// (BenchOptions.Counts): who did it (a service's Postgres role, or
// "redis" for the commands of every client), what (a statement's text,
// shortened, or a Redis command) and how often.
type WorkCount struct {
	Who   string `json:"who"`
	What  string `json:"what"`
	Calls int64  `json:"calls"`
}

// countsReset zeroes Postgres's statement statistics and Redis's command
// statistics, just before the first send.
func countsReset(ctx context.Context, e *env.Env) error {
	if _, err := e.Admin().Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		return fmt.Errorf("lab bench: counts: %w", err)
	}
	if _, err := e.Admin().Exec(ctx, "SELECT pg_stat_statements_reset()"); err != nil {
		return fmt.Errorf("lab bench: counts: %w", err)
	}
	if err := e.RedisClient().ConfigResetStat(ctx).Err(); err != nil {
		return fmt.Errorf("lab bench: counts: %w", err)
	}
	return nil
}

// countsRead reads what countsReset zeroed: the services' statements (by
// role) and every Redis command (the bench's own few XLEN and XINFO
// calls, one a second, included).
func countsRead(ctx context.Context, e *env.Env) ([]WorkCount, error) {
	rows, err := e.Admin().Query(ctx, `SELECT r.rolname, s.query, s.calls FROM pg_stat_statements s
		JOIN pg_roles r ON r.oid = s.userid WHERE r.rolname IN ('consumers', 'workers') AND s.calls > 0`)
	if err != nil {
		return nil, fmt.Errorf("lab bench: counts: %w", err)
	}
	var out []WorkCount
	for rows.Next() {
		var c WorkCount
		if err := rows.Scan(&c.Who, &c.What, &c.Calls); err != nil {
			rows.Close()
			return nil, fmt.Errorf("lab bench: counts: %w", err)
		}
		c.What = strings.Join(strings.Fields(c.What), " ")
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("lab bench: counts: %w", err)
	}
	info, err := e.RedisClient().Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, fmt.Errorf("lab bench: counts: %w", err)
	}
	// Lines read "cmdstat_xadd:calls=12,usec=34,…".
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		n, err := strconv.ParseInt(calls, 10, 64)
		if err != nil || n == 0 {
			continue
		}
		out = append(out, WorkCount{Who: "redis", What: strings.TrimPrefix(name, "cmdstat_"), Calls: n})
	}
	slices.SortFunc(out, func(a, b WorkCount) int {
		if c := strings.Compare(a.Who, b.Who); c != 0 {
			return c
		}
		return int(b.Calls - a.Calls)
	})
	return out, nil
}

// writeCounts prints the counts per message shown: a total per who, then
// each line at or above 0.01 per message.
func writeCounts(w io.Writer, counts []WorkCount, shown int) {
	if len(counts) == 0 || shown == 0 {
		return
	}
	fmt.Fprintf(w, "\nwork per message shown (%d): Postgres statements by role (pg_stat_statements), Redis commands (INFO commandstats; a script's own calls counted too)\n", shown)
	totals := map[string]int64{}
	var whos []string
	for _, c := range counts {
		if _, ok := totals[c.Who]; !ok {
			whos = append(whos, c.Who)
		}
		totals[c.Who] += c.Calls
	}
	for _, who := range whos {
		fmt.Fprintf(w, "  %-9s %7.2f in all\n", who, float64(totals[who])/float64(shown))
		for _, c := range counts {
			per := float64(c.Calls) / float64(shown)
			if c.Who != who || per < 0.01 {
				continue
			}
			what := c.What
			if r := []rune(what); len(r) > 110 {
				what = string(r[:110]) + "…"
			}
			fmt.Fprintf(w, "  %-9s %7.3f  %s\n", "", per, what)
		}
	}
}
