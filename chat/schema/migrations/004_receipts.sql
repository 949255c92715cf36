-- 004_receipts: delivery receipts and re-drive (issue 9). Shipped: never
-- edit; add a later file instead.

-- When the other service's receipt said it had stored this message (the
-- receiver's inbox commit time); NULL until then. redrives counts the times
-- the re-drive published the message again; redriven_at is the last one
-- (per-message backoff).
ALTER TABLE messages
  ADD COLUMN delivered_at timestamptz,
  ADD COLUMN redrives     integer NOT NULL DEFAULT 0,
  ADD COLUMN redriven_at  timestamptz;

-- Undelivered messages only: a receipt's UPDATE finds the rows it marks
-- (chat_id = c AND seq <= n AND delivered_at IS NULL) without walking the
-- chat's delivered past, and the re-drive scans just what is in flight.
CREATE INDEX messages_undelivered ON messages (chat_id, seq) WHERE delivered_at IS NULL;

-- Receiver side: per chat, the highest seq N such that every message
-- 1..N of the other service is in the inbox (what a receipt reports). One
-- row per chat, written once per inbox batch that touched the chat.
CREATE TABLE inbox_chats (
  chat_id       bigint PRIMARY KEY,
  received_upto bigint NOT NULL
);
