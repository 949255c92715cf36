-- 007_insert_only_receipts: the sender's receipts become insert-only
-- (issues 9 and 17). Shipped: never edit; add a later file instead.
--
-- A receipt used to UPDATE messages.delivered_at on every message it
-- covered: one more version of each message row, new entries in each of
-- its indexes (the partial index messages_undelivered made the update
-- non-HOT), and a partial index whose dead entries a held xmin horizon
-- keeps, so the receipts' UPDATE and the re-drive's scan grew with every
-- message (measured in lab bench: throughput 0.74–0.86× the build without
-- receipts, Postgres CPU +43 %). Now an applied receipt inserts one row per
-- chat it advances: "every message of chat_id with seq <= upto_seq was
-- delivered at delivered_at". A message's delivered_at is the time of the
-- first row at or above its seq (the view messages_with_receipts). Rows
-- are inserted only above the chat's newest, so upto_seq and delivered_at
-- both grow along a chat's rows. Nothing here is ever updated or deleted:
-- a message's delivery time stays readable for as long as the message.
CREATE TABLE receipts (
  chat_id      bigint      NOT NULL,
  upto_seq     bigint      NOT NULL CHECK (upto_seq > 0),
  delivered_at timestamptz NOT NULL,
  PRIMARY KEY (chat_id, upto_seq)
);

-- Each run of messages one receipt marked (same chat, same delivered_at)
-- becomes one row at the run's highest seq.
INSERT INTO receipts (chat_id, upto_seq, delivered_at)
  SELECT chat_id, max(seq), delivered_at FROM messages
  WHERE delivered_at IS NOT NULL
  GROUP BY chat_id, delivered_at;

-- For operators and tests: the messages with the delivered_at that the
-- receipts give them (NULL while none covers the message).
CREATE VIEW messages_with_receipts AS
  SELECT m.id, m.chat_id, m.seq, m.body, m.created_at, m.client_id, m.author,
         m.redrives, m.redriven_at,
         (SELECT r.delivered_at FROM receipts r
           WHERE r.chat_id = m.chat_id AND r.upto_seq >= m.seq
           ORDER BY r.upto_seq LIMIT 1) AS delivered_at
  FROM messages m;

DROP INDEX messages_undelivered;
ALTER TABLE messages DROP COLUMN delivered_at;
