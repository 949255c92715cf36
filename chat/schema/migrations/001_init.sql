-- 001_init: the chat's tables. Applied with search_path set to the service's
-- schema (consumers or workers), as the service's own role, so every object
-- is owned by that role and lives in that schema. Shipped: never edit; add
-- 002_*.sql instead.

-- Per-chat counter of this service's messages. The send transaction locks the
-- row (INSERT ... ON CONFLICT DO UPDATE), so seq order = commit order.
CREATE TABLE chats (
  chat_id  bigint PRIMARY KEY CHECK (chat_id > 0),
  last_seq bigint NOT NULL
);

-- Messages this service sent.
CREATE TABLE messages (
  id         uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
  chat_id    bigint      NOT NULL,
  seq        bigint      NOT NULL,
  body       text        NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (chat_id, seq)
);

-- The transactional outbox (shape of outbox.TableDDL).
CREATE TABLE outbox (
  id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  event           text        NOT NULL,
  idempotency_key text        NOT NULL,
  payload         jsonb       NOT NULL,
  created_at      timestamptz NOT NULL DEFAULT now(),
  sent_at         timestamptz,
  attempts        integer     NOT NULL DEFAULT 0,
  last_error      text
);
CREATE INDEX outbox_unsent ON outbox (id) WHERE sent_at IS NULL;

-- Messages received from the other service, one row per message id: the
-- inbox's dedupe key. (chat_id, seq) is unique too: a sender that numbered
-- two different messages alike is a poison job, dead-lettered.
CREATE TABLE inbox (
  message_id  uuid        PRIMARY KEY,
  chat_id     bigint      NOT NULL,
  seq         bigint      NOT NULL,
  body        text        NOT NULL,
  sender      text        NOT NULL,
  sent_at     timestamptz NOT NULL,
  received_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (chat_id, seq)
);

-- One row per duplicate delivery the inbox skipped, so the count survives
-- restarts (the lab's "duplicates skipped" reads it).
CREATE TABLE inbox_duplicates (
  message_id uuid        NOT NULL,
  seen_at    timestamptz NOT NULL DEFAULT now()
);
