package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/schema"
	"github.com/outboxchat/outboxchat/chat/status"
	"github.com/outboxchat/outboxchat/internal/testenv"
	"github.com/outboxchat/outboxchat/lab/labtest"
	"github.com/outboxchat/outboxchat/redisq"
)

// TestMain builds the outboxchat binary once (the lab commands start it
// as the services' processes); the operator commands' tests use the shared
// test servers.
func TestMain(m *testing.M) { labtest.Main(m, "cmd-test-") }

// runCmd runs the binary's run with args and returns stdout and the error.
func runCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := run(context.Background(), args, &out, &errOut)
	if testing.Verbose() {
		t.Logf("%s: err %v\nstderr: %s", strings.Join(args[:2], " "), err, errOut.String())
	}
	return out.String(), err
}

// The operator commands against private servers: status finds a parked
// row and a dead letter and exits non-zero; outbox parked|retry and
// deadletters list|show|replay|drop mend them, each idempotent; status is
// then healthy, and warns again while a snapshot is held too long.
func TestOperatorCommands(t *testing.T) {
	ctx := context.Background()
	dbURL, admin := migratedDatabase(t)
	redisURL, prefix := testenv.RedisURL(t), testenv.Prefix(t)
	conn := []string{"--database-url", dbURL, "--redis-url", redisURL, "--redis-prefix", prefix}
	db := []string{"--database-url", dbURL}
	rds := []string{"--redis-url", redisURL, "--redis-prefix", prefix}

	// A parked consumers row and a signed entry the workers' worker
	// dead-lettered.
	var rowID int64
	if err := admin.QueryRow(ctx, `INSERT INTO consumers.outbox (event, idempotency_key, payload, failures, attempts, last_error, parked_at)
		VALUES ('message.created', 'm-1', '{"seq":1}', 10, 10, 'refused', now()) RETURNING id`).Scan(&rowID); err != nil {
		t.Fatal(err)
	}
	rdb := testenv.Redis(t)
	queue := chat.QueueName(chat.Consumers)
	pub, err := redisq.NewPublisher(rdb, &redisq.PublisherConfig{Queue: queue, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Add(ctx, redisq.Job{ID: "m-2", Name: "message.created", Payload: []byte(`{"seq":2}`), Sig: "v1=abc"}); err != nil {
		t.Fatal(err)
	}
	cons, err := redisq.NewConsumer(rdb, &redisq.ConsumerConfig{Queue: queue, Prefix: prefix, Group: chat.Workers, Consumer: "w1", Block: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ds, err := cons.Fetch(ctx, 10)
	if err != nil || len(ds) != 1 {
		t.Fatalf("fetch = %v, %v", ds, err)
	}
	if err := cons.DeadLetter(ctx, ds[0], "poison: test"); err != nil {
		t.Fatal(err)
	}

	out, err := runCmd(t, append([]string{"status", "--json"}, conn...)...)
	if !errors.Is(err, errNeedsPerson) {
		t.Fatalf("status = %v; want errNeedsPerson (exit 1)", err)
	}
	var st status.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status --json: %v: %s", err, out)
	}
	if len(st.Services) != 2 || st.Healthy || len(st.Problems) != 2 {
		t.Fatalf("status %+v; want two services, two problems", st)
	}
	c, w := st.Services[0], st.Services[1]
	if c.Service != "consumers" || c.Parked != 1 || c.Unsent != 0 || c.DeadLetters != 0 ||
		w.Service != "workers" || w.DeadLetters != 1 || w.StreamPending != 0 || len(w.Consumers) != 1 || w.Consumers[0].Name != "w1" {
		t.Fatalf("status services %+v", st.Services)
	}
	for _, key := range []string{`"service"`, `"unsent"`, `"oldest_unsent_seconds"`, `"parked"`, `"stream_pending"`, `"dead_letters"`} {
		if !strings.Contains(out, key) {
			t.Errorf("status --json lacks %s", key)
		}
	}
	if text, err := runCmd(t, append([]string{"status"}, conn...)...); !errors.Is(err, errNeedsPerson) ||
		!strings.Contains(text, "NEEDS A PERSON (2)") || !strings.Contains(text, "parked outbox row") {
		t.Fatalf("status text = %v:\n%s", err, text)
	}
	// Every command status suggests runs as printed, and shows what the
	// problem names (the row's key, the entry's id).
	suggested := suggestedCommands(st.Problems)
	if len(suggested) != 2 {
		t.Fatalf("status suggested %q; want the outbox parked and deadletters list commands", suggested)
	}
	for _, line := range suggested {
		args, err := shellSplit(strings.TrimPrefix(line, "outboxchat "))
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		out, err := runCmd(t, args...)
		if err != nil || !(strings.Contains(out, "m-1") || strings.Contains(out, "m-2")) {
			t.Errorf("the suggested `%s` = %v:\n%s", line, err, out)
		}
	}

	// outbox parked | retry.
	out, err = runCmd(t, append([]string{"outbox", "parked", "--service", "consumers", "--json"}, db...)...)
	if err != nil || !strings.Contains(out, `"id": "m-1"`) || !strings.Contains(out, `"last_error": "refused"`) {
		t.Fatalf("outbox parked = %v: %s", err, out)
	}
	out, err = runCmd(t, append([]string{"outbox", "retry", "--service", "consumers", "--id", "999999," + jsonInt(rowID), "--json"}, db...)...)
	if err != nil || !strings.Contains(out, `"id": "m-1"`) {
		t.Fatalf("outbox retry = %v: %s", err, out)
	}
	if out, err = runCmd(t, append([]string{"outbox", "retry", "--service", "consumers", "--all"}, db...)...); err != nil || !strings.Contains(out, "retried 0") {
		t.Fatalf("second outbox retry = %v: %s (want a no-op)", err, out)
	}
	var parked, unsent int
	if err := admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE parked_at IS NOT NULL), count(*) FILTER (WHERE parked_at IS NULL) FROM consumers.outbox`).Scan(&parked, &unsent); err != nil || parked != 0 || unsent != 1 {
		t.Fatalf("after retry: %d parked, %d unsent, %v; want 0 and 1", parked, unsent, err)
	}

	// deadletters list | show | replay | drop.
	out, err = runCmd(t, append([]string{"deadletters", "list", "--json"}, rds...)...)
	var list []struct {
		Service string
		DeadID  string `json:"dead_id"`
		ID      string
		Reason  string
		Signed  bool
	}
	if err != nil || json.Unmarshal([]byte(out), &list) != nil || len(list) != 1 || list[0].ID != "m-2" || !list[0].Signed {
		t.Fatalf("deadletters list = %v: %s", err, out)
	}
	dead := list[0].DeadID
	if out, err = runCmd(t, append([]string{"deadletters", "show", "--service", "workers", dead}, rds...)...); err != nil ||
		!strings.Contains(out, "poison: test") || !strings.Contains(out, `{"seq":2}`) {
		t.Fatalf("deadletters show = %v: %s", err, out)
	}
	if out, err = runCmd(t, append([]string{"deadletters", "replay", "--service", "workers", dead}, rds...)...); err != nil || !strings.Contains(out, "replayed 1 of 1") {
		t.Fatalf("deadletters replay = %v: %s", err, out)
	}
	if out, err = runCmd(t, append([]string{"deadletters", "replay", "--service", "workers", dead}, rds...)...); err != nil || !strings.Contains(out, "replayed 0 of 1") {
		t.Fatalf("second replay = %v: %s (want a no-op)", err, out)
	}
	ds, err = cons.Fetch(ctx, 10)
	if err != nil || len(ds) != 1 || ds[0].ID != "m-2" || ds[0].Sig != "v1=abc" {
		t.Fatalf("after replay the worker fetched %+v, %v; want m-2 with its sig", ds, err)
	}
	if err := cons.DeadLetter(ctx, ds[0], "poison again"); err != nil {
		t.Fatal(err)
	}
	if out, err = runCmd(t, append([]string{"deadletters", "drop", "--service", "workers", "--all"}, rds...)...); err != nil || !strings.Contains(out, "dropped 1 of 1") {
		t.Fatalf("deadletters drop = %v: %s", err, out)
	}
	if _, err := runCmd(t, append([]string{"deadletters", "drop", "--service", "workers"}, rds...)...); err == nil {
		t.Fatal("drop without ids or --all succeeded")
	}

	if out, err := runCmd(t, append([]string{"status"}, conn...)...); err != nil || !strings.Contains(out, "healthy") {
		t.Fatalf("status after mending = %v:\n%s", err, out)
	}

	// Issue 17: a snapshot held too long is a problem.
	hold, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close(ctx)
	if _, err := hold.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ"); err != nil {
		t.Fatal(err)
	}
	if _, err := hold.Exec(ctx, "SELECT count(*) FROM consumers.outbox"); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "status to warn of the held snapshot", func() bool {
		out, err := runCmd(t, append([]string{"status", "--max-transaction-age", "200ms"}, conn...)...)
		return errors.Is(err, errNeedsPerson) && strings.Contains(out, "holds back cleanup")
	})
}

func jsonInt(n int64) string { b, _ := json.Marshal(n); return string(b) }

// testDatabase is a fresh database of the shared private Postgres: its
// superuser URL and a pool on it, closed when the test ends.
func testDatabase(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	dbURL := testenv.Database(t)
	admin, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	return dbURL, admin
}

// migratedDatabase is testDatabase with both services' roles and schemas
// in place (schema.Bootstrap and schema.Migrate).
func migratedDatabase(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	dbURL, admin := testDatabase(t)
	for _, s := range []string{chat.Consumers, chat.Workers} {
		if err := schema.Bootstrap(context.Background(), admin, s); err != nil {
			t.Fatal(err)
		}
		if _, err := schema.Migrate(context.Background(), admin, s); err != nil {
			t.Fatal(err)
		}
	}
	return dbURL, admin
}

// suggestedCommands returns the `outboxchat …` commands quoted in problems.
func suggestedCommands(problems []string) []string {
	var out []string
	for _, p := range problems {
		for i, part := range strings.Split(p, "`") {
			if i%2 == 1 && strings.HasPrefix(part, "outboxchat ") {
				out = append(out, part)
			}
		}
	}
	return out
}

// shellSplit splits a command line as a POSIX shell would for words of
// plain characters and single-quoted strings ('\” for a quote), the
// forms status prints; anything else is an error.
func shellSplit(line string) ([]string, error) {
	var args []string
	var cur strings.Builder
	in, word := false, false
	for _, r := range line {
		switch {
		case r == '\'':
			in, word = !in, true
		case in:
			cur.WriteRune(r)
		case r == ' ':
			if word {
				args, word = append(args, cur.String()), false
				cur.Reset()
			}
		case strings.ContainsRune("\"$`\\;&|<>()*?!#~", r):
			return nil, fmt.Errorf("unquoted %q in %q", r, line)
		default:
			cur.WriteRune(r)
			word = true
		}
	}
	if in {
		return nil, fmt.Errorf("unterminated quote in %q", line)
	}
	if word {
		args = append(args, cur.String())
	}
	return args, nil
}
