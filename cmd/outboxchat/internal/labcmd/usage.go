package labcmd

// Usage is the usage text of `outboxchat lab`, one line (or two) per
// command with its flags.
const Usage = `usage: outboxchat lab <command> [flags]

commands:
  up      start private Postgres and Redis and both services; print their URLs; Ctrl-C stops all:
          [--consumers-addr PORT] [--workers-addr PORT] [--keep-logs] [--variant v2] [--tls] [--durable] [--instances N]
  chaos   the write-up's fault experiment: --variant v1|v2 [--json]; or --scenario NAME; --list
  scenario NAME [--json] [--redrive-after D]: a named fault scenario (redis-flush, stream-entry-deleted, …); --list
  latency the write-up's latency table: [--variants v1,v2,v2-intx,v2-poll] [--messages 100] [--interval 100ms]
          [--runs 3] [--instances 1] [--durable] [--json] [--plot lab-output/latency-cdf.png]; plus the floors (commit, PING, NOTIFY)
  bench   sustained load: [--senders 16] [--chats 100] [--messages 20000] [--variant v2] [--hold-snapshot] [--pgbouncer] [--durable] [--history-retention D] [--profile-dir DIR] [--counts] [--partitions N] [--redis-latency D] [--json]
  demo    chaos v1, then chaos v2, then the latency table (1 run); fails unless results are as expected
  torture random fault schedules checked by an independent checker: [--schedules 10] [--seed 1]
          [--schedule K] [--duration 20s] [--drain-bound 60s] [--drop I,J] [--shrink] [--dir DIR] [-v] [--json]
`
