-- 002_seq_idempotency: no per-message update of a shared row (issue 17), and
-- idempotent sends (issue 10). Applied like 001 (search_path = the service's
-- schema, as its role). Shipped: never edit.

-- A chat's seq is no longer a counter row updated by every send: the send
-- transaction takes the chat's advisory transaction lock and numbers from
-- max(seq) of the (chat_id, seq) unique index (chat/batch.go). The counter
-- table is gone with it: a binary from before 002 refuses to send against
-- this schema (its upsert fails, nothing is stored) until it is replaced.
DROP TABLE chats;

-- The client's idempotency key (Idempotency-Key header or client_id), unique
-- per chat, kept as long as the message (so for at least the 24 h the API
-- promises). NULL when the client gave none.
ALTER TABLE messages ADD COLUMN client_id text
  CHECK (octet_length(client_id) BETWEEN 1 AND 128);
CREATE UNIQUE INDEX messages_client_id ON messages (chat_id, client_id) WHERE client_id IS NOT NULL;

-- The relay now deletes the rows it has published instead of setting
-- sent_at; rows an older relay marked sent are of no further use.
DELETE FROM outbox WHERE sent_at IS NOT NULL;
