-- 006_operations: poison rows parked at the relay, and the relay's
-- heartbeat (issue 12). Applied like 001 (search_path = the service's
-- schema, as its role). Shipped: never edit; add a later file instead.

-- outbox.ParkingDDL: failures counts the publishes the publisher blamed on
-- the row itself (attempts counts every failed pass), retry_at is when it
-- may be tried again (it holds back the rows behind it until then), and
-- parked_at when it was parked after --relay-max-attempts failures (no
-- longer claimed; `outboxchat outbox parked|retry`).
ALTER TABLE outbox
  ADD COLUMN failures  integer NOT NULL DEFAULT 0,
  ADD COLUMN retry_at  timestamptz,
  ADD COLUMN parked_at timestamptz;

-- One row per relay process (its consumer name), written at most once per
-- 5 s while its passes run (never per message): when its last pass
-- committed, by the database clock. `outboxchat status` shows the newest.
CREATE TABLE relay_heartbeat (
  relay   text        PRIMARY KEY,
  pass_at timestamptz NOT NULL
);
