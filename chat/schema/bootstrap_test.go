package schema

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/internal/testenv"
)

// TestBootstrapConcurrentAcrossDatabases: bootstraps of several databases
// of one server, started together while the service roles do not exist
// yet, all succeed. Roles are cluster-wide and the advisory lock is per
// database, so the losers of the CREATE ROLE race must still find the
// winner's role. Each round drops the databases and the roles again.
func TestBootstrapConcurrentAcrossDatabases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := testenv.PrivatePostgres(t)
	admin, err := pgxpool.New(ctx, srv.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	const dbs = 6
	for round := range 3 {
		pools := make([]*pgxpool.Pool, dbs)
		for i := range pools {
			name := fmt.Sprintf("boot%d", i)
			if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
				t.Fatal(err)
			}
			if pools[i], err = pgxpool.New(ctx, srv.URL(name)); err != nil {
				t.Fatal(err)
			}
			if err := pools[i].Ping(ctx); err != nil {
				t.Fatal(err)
			}
		}
		var start, done sync.WaitGroup
		start.Add(1)
		errs := make(chan error, 2*dbs)
		for _, p := range pools {
			for _, s := range []string{chat.Consumers, chat.Workers} {
				done.Add(1)
				go func() {
					defer done.Done()
					start.Wait()
					errs <- Bootstrap(ctx, p, s)
				}()
			}
		}
		start.Done()
		done.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Errorf("round %d: %v", round, err)
			}
		}
		for i, p := range pools {
			p.Close()
			if _, err := admin.Exec(ctx, fmt.Sprintf("DROP DATABASE boot%d", i)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := admin.Exec(ctx, "DROP ROLE consumers, workers"); err != nil {
			t.Fatal(err)
		}
	}
}
