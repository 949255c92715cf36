-- 014_seq_fence: a chat's seq never goes backwards when the database loses
-- commits (a failover to an asynchronous replica that had not received
-- them, a point-in-time restore). Applied like 001 (search_path = the
-- service's schema, as its role). Shipped: never edit; add a later file.
--
-- Rows deleted by a statement leave a floor (migration 008); commits that
-- a failover loses leave nothing in the database. What survives them is
-- the Redis high-water mark of the seqs the relay has published per chat
-- (chat/store.Fence). Each database incarnation the service runs on, named
-- by the cluster's system identifier and WAL timeline (a promotion or a
-- point-in-time restore starts a new timeline; a restore into a new
-- cluster has a new system identifier), is fenced once: every chat whose
-- high-water mark is above what the database holds gets a seq floor at the
-- mark, the seqs in between are recorded as lost, and a seq.floor event
-- tells the receiver not to wait for them.
CREATE TABLE seq_epochs (
  system_id text        NOT NULL,
  timeline  int         NOT NULL,
  fenced_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (system_id, timeline)
);

-- Seqs from_seq..to_seq of chat_id were published by this service and are
-- no longer in its database: only the old primary had them. `status`
-- reports them; an operator who recovers the old primary's data can
-- compare. Rows stay until an operator deletes them.
CREATE TABLE seq_lost (
  chat_id     bigint      NOT NULL,
  from_seq    bigint      NOT NULL,
  to_seq      bigint      NOT NULL,
  system_id   text        NOT NULL,
  timeline    int         NOT NULL,
  recorded_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (chat_id, from_seq)
);
