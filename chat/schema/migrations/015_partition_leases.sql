-- 015_partition_leases: leases of the outbox partitions (serve
-- --partitions N). Applied like 001 (search_path = the service's schema,
-- as its role). Shipped: never edit; add a later file.
--
-- One row per partition (schema.EnsurePartitions inserts 0 … N-1): the
-- process (its consumer name) that runs the partition's relay until
-- expires_at, on the database clock. A row with no owner, or expired, is
-- free. Leases are rows, not advisory locks, so they work through a
-- transaction-mode pooler; correctness never depends on them (two relays
-- on one partition serialise on the claim, adds are idempotent, the inbox
-- drops duplicates): they only spread the partitions over the processes.
CREATE TABLE partition_leases (
  partition  int         PRIMARY KEY,
  owner      text,
  expires_at timestamptz NOT NULL DEFAULT '-infinity'
);

-- The live processes that take leases, each renewing its row with its
-- leases: a process's fair share is the partitions divided by the live
-- members (a new member, still holding nothing, counts at once).
CREATE TABLE partition_members (
  owner      text        PRIMARY KEY,
  expires_at timestamptz NOT NULL
);
