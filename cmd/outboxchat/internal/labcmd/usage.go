package labcmd

// Usage is the usage text of `outboxchat lab`, one line (or two) per
// command with its flags.
const Usage = `usage: outboxchat lab <command> [flags]

commands:
  up      start private Postgres and Redis and both services; print their URLs; Ctrl-C stops all:
          [--consumers-addr PORT] [--workers-addr PORT] [--keep-logs] [--variant v2] [--tls] [--durable] [--instances N]
          [--partitions N] [--redis-cluster] [--broker redis|nats]
  chaos   the write-up's fault experiment: [--variant v1|v2 (default v2)] [--broker redis|nats] [--json]; or --scenario NAME; --list
  scenario NAME [--json] [--redrive-after D] [--broker redis|nats] [--partitions N]: a named fault scenario
          (redis-flush, stream-entry-deleted, …); --list
  latency the write-up's latency table: [--variants v1,v2,v2-intx,v2-poll] [--messages 100] [--interval 100ms]
          [--runs 3] [--instances 1] [--durable] [--json] [--plot lab-output/latency-cdf.png]; plus the floors (commit, PING, NOTIFY)
  bench   sustained load: [--senders 16] [--chats 100] [--messages 20000] [--transport http|ws] [--variant v2] [--durable]
          [--hold-snapshot] [--pgbouncer] [--history-retention D] [--profile-dir DIR] [--profile-seconds 10] [--counts]
          [--partitions N] [--timeout 5m] [--broker redis|nats] [--redis-latency D] [--insecure] [--json]
  demo    chaos v1, then chaos v2, then the latency table (1 run); fails unless results are as expected: [--broker redis|nats]
  torture random fault schedules checked by an independent checker: [--schedules 10] [--seed 1]
          [--schedule K] [--duration 20s] [--drain-bound 60s] [--drop I,J] [--shrink] [--dir DIR] [-v] [--json]
          [--broker redis|nats] [--partitions N] [--redis-cluster]
`
