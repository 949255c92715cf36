-- 005_insert_only_watermarks: the receiver's per-chat watermark becomes
-- insert-only (issue 17). Shipped: never edit; add a later file instead.
--
-- inbox_chats kept one row per chat, updated by every inbox batch that
-- touched the chat: a hot row. While a session holds back the xmin horizon
-- its dead versions cannot be pruned, and each read walked a HOT chain
-- that grew with every batch (measured: 93,502 dead versions on 100 rows
-- after 150,000 messages, throughput falling to a third). Now each advance
-- inserts a new (chat_id, upto) row and deletes the older ones of that
-- chat; the newest row is read by a backward scan of the primary key,
-- which meets it first, so dead rows below it cost nothing however many
-- of them a held snapshot keeps.
CREATE TABLE inbox_watermarks (
  chat_id bigint NOT NULL,
  upto    bigint NOT NULL,
  PRIMARY KEY (chat_id, upto)
);

INSERT INTO inbox_watermarks (chat_id, upto)
  SELECT chat_id, received_upto FROM inbox_chats;

DROP TABLE inbox_chats;
