-- 007_insert_only_receipts: receipts without a row written per chat and
-- batch on the receiver, and without an UPDATE of every message on the
-- sender (issues 9 and 17). Shipped: never edit; add a later file instead.
--
-- Receiver. inbox_watermarks took one insert per chat per inbox batch (and
-- a delete by the pruner later): under load a batch spans many chats, so
-- about one row per message, and the receipts' emit was the costliest
-- statement of a lab bench run (1.0 ms per batch, 2.6 s of Postgres time
-- for 50,000 messages). Now each inbox row says whether it was stored
-- behind a gap: held = false means every seq from 1 to this one was in
-- the inbox when it was stored. The insert decides it from the row below
-- the batch's first row of the chat (one probe). When a gap is filled, the
-- rows held behind it stay as they are (no UPDATE): a row goes into
-- inbox_gap_fills instead, "seqs 1..upto are all in the inbox now", and a
-- later row whose predecessor is held but at or below that is not held.
-- The chat's watermark is the highest of its top row when not held, the
-- highest row not held and its newest gap fill. Both tables are only
-- inserted into; inbox_gap_fills only after a gap, which takes a lost or
-- reordered delivery.
ALTER TABLE inbox ADD COLUMN held boolean NOT NULL DEFAULT false;

-- A row is contiguous exactly when its seq equals its rank in the chat.
UPDATE inbox SET held = true WHERE (chat_id, seq) IN (
  SELECT chat_id, seq FROM (
    SELECT chat_id, seq, row_number() OVER (PARTITION BY chat_id ORDER BY seq) AS rn FROM inbox) x
  WHERE x.seq <> x.rn);

CREATE TABLE inbox_gap_fills (
  chat_id bigint NOT NULL,
  upto    bigint NOT NULL,
  PRIMARY KEY (chat_id, upto)
);

DROP TABLE inbox_watermarks;

-- Sender. A receipt used to UPDATE messages.delivered_at on every message it
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
